//! `scripts/sass-census.sh` (the SASS instruction census that `scripts/check-kernels.sh` runs):
//! it passes the tensor-core test kernel of `kernels/ptx.cuh` and fails a copy of it that lost
//! its `mma.sync` (no HMMA in the SASS any more).
//!
//! Needs nvcc, cuobjdump and nvdisasm in scripts/check-kernels.sh's venv; where they are missing
//! the test says so and passes, unless `SORFT_REQUIRE_SOFTGPU=1` (set by `.ci/run`, which runs
//! check-kernels.sh first).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Runs the census on `cu` with `spec`; `None` where the tools are not installed here.
fn census(cu: &Path, spec: &Path) -> Option<Output> {
    let o = Command::new("bash")
        .arg(repo().join("scripts/sass-census.sh"))
        .arg("--spec")
        .arg(spec)
        .arg(cu)
        .output()
        .expect("bash runs");
    let stderr = String::from_utf8_lossy(&o.stderr);
    if stderr.contains("not found beside nvcc") {
        let required = std::env::var("SORFT_REQUIRE_SOFTGPU").is_ok_and(|v| v == "1");
        assert!(!required, "{stderr}");
        eprintln!("SASS census tools not installed here, skipping: {stderr}");
        return None;
    }
    Some(o)
}

fn text(o: &Output) -> String {
    format!(
        "{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn the_census_catches_a_tensor_core_kernel_that_lost_its_mma() {
    let dir = tempfile::tempdir().unwrap();
    let spec = dir.path().join("census.txt");
    std::fs::write(&spec, "ptx_mma_smem HMMA,LDSM,LDGSTS nolocal\n").unwrap();
    let src = std::fs::read_to_string(repo().join("tests/softgpu/ptx_test.cu")).unwrap();
    let good = dir.path().join("ptx_test.cu");
    std::fs::write(&good, &src).unwrap();
    let Some(o) = census(&good, &spec) else {
        return;
    };
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(t.contains("ptx_mma_smem"), "{t}");

    // The planted loss: the tile product done with scalar FMAs instead of mma.sync.
    let from = "    float d[4] = {0.f, 0.f, 0.f, 0.f};\n    mma_16816_bf16(d, ar, br);";
    assert_eq!(
        src.matches(from).count(),
        1,
        "pattern of the planted change"
    );
    let scalar = "    float d[4] = {0.f, 0.f, 0.f, 0.f};\n    for (int i = 0; i < 4; i++) d[i] += __uint_as_float(ar[i] << 16) * __uint_as_float(br[i & 1] << 16);";
    let bad_dir = tempfile::tempdir().unwrap();
    let bad = bad_dir.path().join("ptx_test.cu");
    std::fs::write(&bad, src.replacen(from, scalar, 1)).unwrap();
    let o = census(&bad, &spec).expect("the tools were found above");
    let t = text(&o);
    assert!(!o.status.success(), "a kernel without mma passed:\n{t}");
    assert!(
        t.contains("kernel ptx_mma_smem has no HMMA instruction"),
        "{t}"
    );
}

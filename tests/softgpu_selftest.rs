//! The software GPU of `tests/softgpu/` (built by `scripts/softgpu.sh`): the unchanged binary's CUDA
//! backend and every kernel of `kernels/` run on the CPU and are checked against the CPU backend
//! (`sorft selftest --device cuda --quick`), and kernels with planted bugs are caught.
//!
//! Needs g++ and python3. Where they are missing the tests say so and pass, unless
//! `SORFT_REQUIRE_SOFTGPU=1` (set by `.ci/run`, which builds the software GPU first).

use std::path::Path;
use std::process::{Command, Output};

mod softgpu_common;
use softgpu_common::{build, repo, sorft, text};

#[test]
fn doctor_names_the_software_gpu_and_the_loaded_kernels() {
    let Some(lib) = build(None, None) else { return };
    let o = sorft(&lib, &["doctor"], &[]);
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(t.contains("gpu 0:    sorft software GPU"), "{t}");
    assert!(
        t.contains("backend:  cuda:0 (sorft software GPU) (kernels from NVRTC"),
        "{t}"
    );
}

#[test]
fn every_kernel_the_backend_launches_is_built_into_the_software_gpu() {
    let Some(lib) = build(None, None) else { return };
    let gen = lib.parent().unwrap().join("gen");
    let mut built = std::collections::HashSet::new();
    for e in std::fs::read_dir(&gen).unwrap() {
        let p = e.unwrap().path();
        if !p.file_name().unwrap().to_string_lossy().starts_with("k_") {
            continue;
        }
        for line in std::fs::read_to_string(&p).unwrap().lines() {
            if let Some(rest) = line.strip_prefix("SG_KERNEL(") {
                let name = rest.split(", ").nth(1).unwrap().trim_end_matches(')');
                built.insert(name.to_string());
            }
        }
    }
    let missing: Vec<String> = sorft::engine::cuda::registry::launched_kernels()
        .into_iter()
        .filter(|k| !built.contains(k))
        .collect();
    assert!(built.len() > 50, "{built:?}");
    assert!(missing.is_empty(), "launched but not built: {missing:?}");
}

#[test]
fn every_kernel_family_matches_the_cpu_backend_on_the_software_gpu() {
    let Some(lib) = build(None, None) else { return };
    let o = sorft(&lib, &["selftest", "--device", "cuda", "--quick"], &[]);
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(t.contains("selftest on cuda:0 (sorft software GPU)"), "{t}");
    assert!(t.contains(" 0 failed"), "{t}");
    for family in [
        "embedding",
        "rms_norm_backward dweight",
        "matmul",
        "adamw",
        "attention_backward dk",
        "attention (kv cache)",
        "token_logprobs_backward",
        "sample T=0.7 top-k=4 top-p=0.8 chi-square",
        "model gradient",
        "model AdamW step",
    ] {
        assert!(
            t.contains(&format!("ok   {family}")),
            "{family} not checked:\n{t}"
        );
    }
    assert!(!t.contains("softgpu: kernel"), "{t}");
}

/// Copies kernels/ to a temporary folder with `from` replaced by `to` in `file` (exactly once).
fn planted(file: &str, from: &str, to: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(repo().join("kernels")).unwrap() {
        let p = e.unwrap().path();
        std::fs::copy(&p, dir.path().join(p.file_name().unwrap())).unwrap();
    }
    let path = dir.path().join(file);
    let src = std::fs::read_to_string(&path).unwrap();
    assert_eq!(
        src.matches(from).count(),
        1,
        "the planted bug's pattern must occur once in {file}: {from}"
    );
    std::fs::write(&path, src.replacen(from, to, 1)).unwrap();
    dir
}

/// Runs the selftest on kernels with a planted bug and returns its output (it must fail).
fn run_planted(kernels: &Path) -> Option<String> {
    let out = tempfile::tempdir().unwrap();
    let lib = build(Some(kernels), Some(out.path()))?;
    let o = sorft(
        &lib,
        &["selftest", "--device", "cuda", "--quick", "--no-model"],
        &[("SOFTGPU_MATCH", "name")],
    );
    let t = text(&o);
    assert!(!o.status.success(), "a planted bug went unnoticed:\n{t}");
    Some(t)
}

#[test]
fn an_off_by_one_bound_is_caught_at_the_access() {
    let k = planted(
        "elementwise.cu",
        "i < (n); i += (u64)blockDim.x * gridDim.x)",
        "i <= (n); i += (u64)blockDim.x * gridDim.x)",
    );
    let Some(t) = run_planted(k.path()) else {
        return;
    };
    assert!(t.contains("out-of-bounds"), "{t}");
    assert!(t.contains("past the end of a"), "{t}");
    assert!(t.contains("elementwise.cu:"), "{t}");
    assert!(
        t.contains("kernel embedding_f32") || t.contains("kernel "),
        "{t}"
    );
}

#[test]
fn a_missing_syncthreads_is_caught_in_shared_memory() {
    let k = planted(
        "common.cuh",
        "    if (lane == 0) scratch[w] = v;\n    __syncthreads();\n    v = lane < nw ? scratch[lane] : 0.f;",
        "    if (lane == 0) scratch[w] = v;\n    v = lane < nw ? scratch[lane] : 0.f;",
    );
    let Some(t) = run_planted(k.path()) else {
        return;
    };
    assert!(
        t.contains("race on shared memory")
            || t.contains("of shared memory at 0x")
                && t.contains("no thread of this block has written"),
        "{t}"
    );
}

#[test]
fn a_causal_mask_that_lets_a_row_see_the_next_key_fails_the_comparison() {
    let k = planted(
        "attention.cu",
        "bool valid = j <= row;",
        "bool valid = j <= row + 1;",
    );
    let Some(t) = run_planted(k.path()) else {
        return;
    };
    assert!(t.contains("FAIL attention_train out"), "{t}");
}

#[test]
fn a_missing_barrier_before_a_tile_is_overwritten_is_a_shared_memory_race() {
    // The GEMM's second barrier keeps the next K tile from overwriting the one still being read:
    // without it every input is initialised, so only the race mode can see the bug.
    let end_of_k_step = "                for (int j = 0; j < 4; j++) acc[i][j] += ra[i] * rb[j];\n        }\n        __syncthreads();\n    }";
    let k = planted(
        "gemm.cu",
        end_of_k_step,
        "                for (int j = 0; j < 4; j++) acc[i][j] += ra[i] * rb[j];\n        }\n    }",
    );
    let Some(t) = run_planted(k.path()) else {
        return;
    };
    assert!(t.contains("race on shared memory"), "{t}");
    assert!(t.contains("kernel gemm_"), "{t}");
}

#[test]
fn an_integer_division_by_zero_in_a_kernel_is_reported_not_a_crash() {
    // A GPU returns an unspecified value; the host traps: the trap fails the launch, naming it.
    let k = planted(
        "elementwise.cu",
        "u32 half = head_dim / 2;",
        "u32 half = head_dim / (head_dim / 256);",
    );
    let Some(t) = run_planted(k.path()) else {
        return;
    };
    assert!(t.contains("integer division by zero"), "{t}");
    assert!(t.contains("kernel rope_"), "{t}");
}

/// Runs the lane-by-lane test of kernels/ptx.cuh's emulations built beside `lib`.
fn ptx_test(lib: &Path, args: &[&str]) -> Output {
    let bin = lib.parent().unwrap().join("bin/ptx_test");
    Command::new(bin)
        .args(args)
        .output()
        .expect("ptx_test runs")
}

#[test]
fn every_ptx_emulation_matches_plain_matrix_products_lane_by_lane() {
    let Some(lib) = build(None, None) else { return };
    let o = ptx_test(&lib, &[]);
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(t.contains("ptx_test: 2272 checks, 0 failed"), "{t}");
}

#[test]
fn a_cp_async_read_before_its_wait_group_is_caught() {
    let Some(lib) = build(None, None) else { return };
    let o = ptx_test(&lib, &["cp-async-early"]);
    let t = text(&o);
    assert!(!o.status.success(), "{t}");
    assert!(t.contains("kernel ptx_cp_async"), "{t}");
    assert!(t.contains("no thread of this block has written"), "{t}");
}

#[test]
fn a_wrong_fragment_layout_in_an_emulation_fails_the_lane_test() {
    // A's registers 1 and 2 swapped (rows 8..15 taken for columns 8..15): the mma checks fail.
    let k = planted(
        "ptx.cuh",
        "int areg = (row >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0);",
        "int areg = (row >= 8 ? 2 : 0) + (k >= 8 ? 1 : 0);",
    );
    let out = tempfile::tempdir().unwrap();
    let Some(lib) = build(Some(k.path()), Some(out.path())) else {
        return;
    };
    let o = ptx_test(&lib, &[]);
    let t = text(&o);
    assert!(!o.status.success(), "{t}");
    assert!(t.contains("FAIL mma bf16 (registers) lane"), "{t}");
    assert!(t.contains("FAIL cp.async + ldmatrix + mma lane"), "{t}");
}

/// `--set` flags that shrink `sorft repro --quick` for the software GPU (no warm-up, prompts and
/// answers cut to 640 and 16 tokens): every stage still runs, at a tenth of the attention work.
const SOFTGPU_REPRO: &[&str] = &[
    "--set",
    "model.warmup_epochs=0",
    // The copy curriculum is another SFT phase on the same kernels as stage 1: off, as the
    // warm-up is, to keep the software GPU's run short.
    "--set",
    "model.curriculum_exercises=0",
    // The historical import-only, single-file generator: its prompts fit max_len 640.
    "--set",
    "data.distractors=0",
    "--set",
    "data.multi_file_fraction=0",
    "--set",
    "data.issue_styles.import=1",
    "--set",
    "data.issue_styles.traceback=0",
    "--set",
    "data.issue_styles.behaviour=0",
    "--set",
    "stage1.max_len=640",
    "--set",
    "stage1.batch_tokens=640",
    "--set",
    "stage2.max_prompt_tokens=640",
    "--set",
    "eval.max_prompt_tokens=640",
    "--set",
    "stage2.max_new_tokens=16",
    "--set",
    "eval.max_new_tokens=16",
];

/// The report's result tables and zero-score reasons (from "## Test mean subtask reward" to the RL
/// monitor), each line split into cells; wall-time columns (headed "... s") are blanked.
fn result_tables(report: &str) -> Vec<Vec<String>> {
    let start = report
        .find("## Test mean subtask reward")
        .expect("a results section");
    let end = report.find("## RL monitor").expect("an RL monitor section");
    let mut timing: Vec<usize> = Vec::new();
    let mut rows = Vec::new();
    for line in report[start..end].lines() {
        let cells: Vec<String> = line.split('|').map(|c| c.trim().to_string()).collect();
        if line.starts_with("| ") && cells.iter().any(|c| c.ends_with(" s")) {
            timing = (0..cells.len())
                .filter(|&i| cells[i].ends_with(" s"))
                .collect();
        } else if !line.starts_with('|') {
            timing.clear();
        }
        let cells = cells
            .into_iter()
            .enumerate()
            .map(|(i, c)| {
                if timing.contains(&i) {
                    String::new()
                } else {
                    c
                }
            })
            .collect();
        rows.push(cells);
    }
    rows
}

/// Cells equal, numbers within `tol` (absolute, the reports print 3 or 4 decimals).
fn tables_match(a: &[Vec<String>], b: &[Vec<String>], tol: f64) -> Result<(), String> {
    if a.len() != b.len() {
        return Err(format!("{} lines vs {}", a.len(), b.len()));
    }
    for (ra, rb) in a.iter().zip(b) {
        let same = ra.len() == rb.len()
            && ra.iter().zip(rb).all(|(x, y)| {
                x == y
                    || matches!((x.parse::<f64>(), y.parse::<f64>()), (Ok(p), Ok(q)) if (p - q).abs() <= tol)
            });
        if !same {
            return Err(format!("{} vs {}", ra.join("|"), rb.join("|")));
        }
    }
    Ok(())
}

#[test]
fn the_tables_of_a_planted_difference_do_not_match() {
    let report = "## Test mean subtask reward (free decoding)\n| stage | file |\n|---|---|\n| sft | 0.333 |\n## Stage 2 (per step)\n| step | reward | rollout s |\n| 1 | 0.500 | 0.2 |\n## RL monitor\n";
    let a = result_tables(report);
    assert_eq!(tables_match(&a, &a, 0.002), Ok(()));
    let slower = result_tables(&report.replace("| 0.2 |", "| 16.7 |"));
    assert_eq!(tables_match(&a, &slower, 0.002), Ok(()));
    let b = result_tables(&report.replace("0.333", "0.334"));
    assert_eq!(tables_match(&a, &b, 0.002), Ok(()));
    let c = result_tables(&report.replace("0.333", "0.500"));
    assert!(tables_match(&a, &c, 0.002).is_err());
    let d = result_tables(&report.replace("| 1 | 0.500", "| 1 | 0.250"));
    assert!(tables_match(&a, &d, 0.002).is_err());
}

#[test]
fn quick_repro_on_the_software_gpu_reports_the_cpu_runs_tables() {
    let Some(lib) = build(None, None) else { return };
    let run = |device: &str| -> String {
        let out = tempfile::tempdir().unwrap();
        let mut args = vec!["repro", "--quick", "--seed", "3", "--dtype", "f32"];
        args.extend(["--device", device]);
        args.extend(SOFTGPU_REPRO);
        let out_s = out.path().to_str().unwrap().to_string();
        args.extend(["--out", &out_s]);
        let o = sorft(&lib, &args, &[]);
        let t = text(&o);
        assert!(o.status.success(), "{device}: {t}");
        assert!(!t.contains("softgpu: kernel"), "{t}");
        std::fs::read_to_string(out.path().join("report.md")).unwrap()
    };
    let gpu = run("cuda");
    assert!(
        gpu.contains("Device: cuda:0 (sorft software GPU), f32"),
        "{gpu}"
    );
    let cpu = run("cpu");
    assert!(cpu.contains("Device: cpu"), "{cpu}");
    let (g, c) = (result_tables(&gpu), result_tables(&cpu));
    assert!(g.len() > 30, "{gpu}");
    if let Err(e) = tables_match(&g, &c, 0.002) {
        panic!("software GPU vs CPU: {e}\n--- cuda\n{gpu}\n--- cpu\n{cpu}");
    }
}

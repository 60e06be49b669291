//! Streamed checkpoints: the files are byte for byte those of the in-memory writer, they are read
//! back memory-mapped, trained weights are not resident twice, and a process killed in the middle
//! of writing a checkpoint leaves the previous one usable.

mod train_util;

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use sorft::engine::cpu::CpuStorage;
use sorft::engine::{Backend, Cpu, DType};
use sorft::model::st_writer::{write_f32_le, StreamTensor};
use sorft::model::Model;
use sorft::train::checkpoint::{
    self, checksum64, host_tensors, safetensors_bytes, stream_tensors, CheckpointWriter,
};
use sorft::train::optim::{AdamW, OptimConfig};
use sorft::train::params::model_params;
use sorft::train::sft::{run_sft, Resume, SftConfig};
use train_util::*;

fn sft_config(root: &Path, out: &str, lora: usize) -> SftConfig {
    let mut c = SftConfig {
        model: root.join("base"),
        data: root.join("train.jsonl"),
        eval_data: Some(root.join("eval.jsonl")),
        out: root.join(out),
        epochs: 1,
        batch_tokens: 256,
        save_every: 0,
        keep_last: 2,
        seed: 3,
        max_steps: 2,
        lora_rank: lora,
        ..SftConfig::default()
    };
    c.optim.lr = 5e-3;
    c
}

fn setup() -> tempfile::TempDir {
    let root = tempfile::tempdir().unwrap();
    tiny_preset(&root.path().join("base"), 1);
    std::fs::write(root.path().join("train.jsonl"), animal_jsonl(64, 10)).unwrap();
    std::fs::write(root.path().join("eval.jsonl"), animal_jsonl(8, 999)).unwrap();
    root
}

#[test]
fn streamed_checkpoint_files_equal_the_in_memory_writers_and_load_back_mapped() {
    let root = setup();
    let cfg = sft_config(root.path(), "full", 0);
    let stop = AtomicBool::new(false);
    let out = run_sft(&Cpu, &cfg, Resume::No, &stop, &mut |_| {}).unwrap();
    let dir = out.last_checkpoint.unwrap();
    checkpoint::verify(&dir).unwrap();

    // The weights, read back memory-mapped, serialise with the old whole-file writer to exactly
    // the streamed file.
    let model = Model::load(&Cpu, &dir).unwrap();
    let old = safetensors_bytes(&host_tensors(&Cpu, model_params(&model), "").unwrap()).unwrap();
    let streamed = std::fs::read(dir.join("model.safetensors")).unwrap();
    assert_eq!(old, streamed);

    // The optimizer moments likewise, loaded through the mapped reader.
    let mut opt = AdamW::new(&Cpu, OptimConfig::default(), &model_params(&model)).unwrap();
    opt.load_state(&Cpu, &dir.join("optimizer.safetensors"))
        .unwrap();
    assert!(opt
        .m
        .iter()
        .any(|m| Cpu.to_host_f32(m).unwrap().iter().any(|&x| x != 0.0)));
    let old = safetensors_bytes(&opt.state_tensors(&Cpu).unwrap()).unwrap();
    assert_eq!(
        old,
        std::fs::read(dir.join("optimizer.safetensors")).unwrap()
    );

    // The manifest's checksums, computed while writing, are those of the whole files.
    let m: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("checksums.json")).unwrap())
            .unwrap();
    for (name, meta) in m["files"].as_object().unwrap() {
        let bytes = std::fs::read(dir.join(name)).unwrap();
        assert_eq!(meta["bytes"], bytes.len());
        assert_eq!(
            meta["checksum64"],
            format!("{:016x}", checksum64(&bytes)),
            "{name}"
        );
    }

    // Metrics carry peak RSS, the memory account and the checkpoint's size.
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(cfg.out.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let step = lines.iter().find(|v| v["loss"].is_number()).unwrap();
    assert!(step["peak_rss_mib"].as_f64().unwrap() > 1.0);
    assert!(step["mem_mib"]["weights"].as_f64().unwrap() > 0.0);
    assert_eq!(step["mem_mib"]["weights"], step["mem_mib"]["grads"]);
    let ck = lines
        .iter()
        .find(|v| v["checkpoint_bytes"].is_number())
        .unwrap();
    let on_disk: u64 = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum();
    assert_eq!(ck["checkpoint_bytes"].as_u64().unwrap(), on_disk);
}

#[test]
fn a_trained_weight_owned_from_a_map_keeps_its_values_and_leaves_the_map() {
    let root = setup();
    let model = Model::load(&Cpu, &root.path().join("base")).unwrap();
    let t = &model.blocks[0].q;
    assert!(matches!(t.storage(), CpuStorage::Mapped(_)));
    let want = Cpu.to_host_f32(t).unwrap();
    let mut owned = Cpu.copy(t).unwrap();
    Cpu.own_weight(&mut owned).unwrap();
    assert!(matches!(owned.storage(), CpuStorage::F32(_)));
    assert_eq!(Cpu.to_host_f32(&owned).unwrap(), want);
    // The map's pages were dropped, not its contents: the mapped tensor still reads the same.
    assert_eq!(Cpu.to_host_f32(t).unwrap(), want);
}

#[test]
fn lora_checkpoints_still_resume_and_export_a_peft_adapter() {
    let root = setup();
    let mut cfg = sft_config(root.path(), "lora", 4);
    cfg.max_steps = 1;
    let stop = AtomicBool::new(false);
    run_sft(&Cpu, &cfg, Resume::No, &stop, &mut |_| {}).unwrap();
    cfg.max_steps = 0;
    let out = run_sft(
        &Cpu,
        &cfg,
        Resume::Latest { fallback: false },
        &stop,
        &mut |_| {},
    )
    .unwrap();
    assert!(out.final_dir.is_some());
    assert!(cfg.out.join("adapter/adapter_model.safetensors").exists());
    Model::load(&Cpu, out.final_dir.as_ref().unwrap()).unwrap();
}

const CHILD_ENV: &str = "SORFT_CKPT_KILL_CHILD";

/// In the child: a committed checkpoint of step 1, then step 2's weights half written when the
/// marker file appears, and no end (the parent kills it).
fn child_writes_and_hangs(root: &Path) {
    let model = Model::load(&Cpu, &root.join("base")).unwrap();
    let ck = root.join("checkpoints");
    let mut w = CheckpointWriter::begin(&ck, 1).unwrap();
    w.add_safetensors(
        "model.safetensors",
        stream_tensors(&Cpu, model_params(&model), ""),
    )
    .unwrap();
    w.add_bytes(
        "config.json",
        &std::fs::read(root.join("base/config.json")).unwrap(),
    )
    .unwrap();
    w.commit().unwrap();
    let mut w = CheckpointWriter::begin(&ck, 2).unwrap();
    let marker = root.join("midway");
    let hang = StreamTensor {
        name: "z.last".into(),
        dtype: DType::F32,
        shape: vec![1 << 16],
        write: Box::new(move |out| {
            write_f32_le(out, &vec![1.0; 1 << 15])?;
            out.flush().unwrap();
            std::fs::write(&marker, b"").unwrap();
            loop {
                std::thread::sleep(Duration::from_secs(1));
            }
        }),
    };
    let mut ts = stream_tensors(&Cpu, model_params(&model), "");
    ts.push(hang);
    let _ = w.add_safetensors("model.safetensors", ts);
}

#[test]
fn sigkill_while_writing_a_checkpoint_leaves_the_previous_one_usable() {
    if let Ok(dir) = std::env::var(CHILD_ENV) {
        child_writes_and_hangs(Path::new(&dir));
        return;
    }
    let root = setup();
    let r = root.path();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "sigkill_while_writing_a_checkpoint_leaves_the_previous_one_usable",
            "--exact",
            "--nocapture",
        ])
        .env(CHILD_ENV, r)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while !r.join("midway").exists() {
        if let Ok(Some(st)) = child.try_wait() {
            panic!("the child ended before writing step 2: {st}");
        }
        assert!(t0.elapsed() < Duration::from_secs(120), "no marker");
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap(); // SIGKILL, in the middle of step 2's model.safetensors
    child.wait().unwrap();
    let ck = r.join("checkpoints");
    let tmp: Vec<String> = std::fs::read_dir(&ck)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".step-00000002.tmp"))
        .collect();
    assert_eq!(
        tmp.len(),
        1,
        "the partial write is in its temporary directory"
    );
    let steps: Vec<u64> = checkpoint::list(&ck).unwrap().iter().map(|s| s.0).collect();
    assert_eq!(steps, vec![1]);
    let (good, skipped) = checkpoint::latest_good(&ck, false).unwrap();
    assert!(skipped.is_empty());
    let good = good.unwrap();
    // The previous checkpoint loads, and holds exactly the base weights.
    let got = Model::load(&Cpu, &good).unwrap();
    let base = Model::load(&Cpu, &r.join("base")).unwrap();
    for ((n, a), (_, b)) in model_params(&got).into_iter().zip(model_params(&base)) {
        assert_eq!(
            Cpu.to_host_f32(a).unwrap(),
            Cpu.to_host_f32(b).unwrap(),
            "{n}"
        );
    }
    // The next save clears the leftover.
    checkpoint::save(&ck, 3, &[("x".into(), b"x".to_vec())]).unwrap();
    checkpoint::prune(&ck, 5).unwrap();
    assert!(!ck.join(&tmp[0]).exists());
}

//! Seccomp layer: `socket()` fails with EACCES for every address family except AF_UNIX.

use crate::sandbox::error::{Result, SandboxError};
use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};
use std::collections::BTreeMap;

fn arch() -> Result<TargetArch> {
    match std::env::consts::ARCH {
        "x86_64" => Ok(TargetArch::x86_64),
        "aarch64" => Ok(TargetArch::aarch64),
        "riscv64" => Ok(TargetArch::riscv64),
        other => Err(SandboxError::Layer {
            layer: "seccomp",
            reason: format!("unsupported architecture {other}"),
        }),
    }
}

/// Compiles the socket filter to BPF (done in the parent, before fork).
pub fn socket_filter() -> Result<BpfProgram> {
    let err = |e: &dyn std::fmt::Display| SandboxError::Layer {
        layer: "seccomp",
        reason: e.to_string(),
    };
    let not_unix = |sys: i64| -> Result<(i64, Vec<SeccompRule>)> {
        let cond = SeccompCondition::new(
            0,
            SeccompCmpArgLen::Dword,
            SeccompCmpOp::Ne,
            libc::AF_UNIX as u64,
        )
        .map_err(|e| err(&e))?;
        Ok((
            sys,
            vec![SeccompRule::new(vec![cond]).map_err(|e| err(&e))?],
        ))
    };
    let mut rules = BTreeMap::new();
    let (k, v) = not_unix(libc::SYS_socket)?;
    rules.insert(k, v);
    let (k, v) = not_unix(libc::SYS_socketpair)?;
    rules.insert(k, v);
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EACCES as u32),
        arch()?,
    )
    .map_err(|e| err(&e))?;
    filter
        .try_into()
        .map_err(|e: seccompiler::BackendError| err(&e))
}

/// True when the kernel accepts seccomp filters (`PR_GET_SECCOMP` works).
pub fn kernel_supports() -> bool {
    // SAFETY: PR_GET_SECCOMP only reads the calling thread's mode.
    unsafe { libc::prctl(libc::PR_GET_SECCOMP, 0, 0, 0, 0) >= 0 }
}

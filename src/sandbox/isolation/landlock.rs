//! Landlock layer: filesystem access limited to the workspace and read-only system trees,
//! no TCP, and (ABI 6+) no signals to processes outside the sandbox.

use crate::sandbox::error::{Result, SandboxError};
use landlock::{
    Access, AccessFs, AccessNet, PathBeneath, PathFd, Ruleset, RulesetAttr, RulesetCreatedAttr,
    Scope, ABI,
};
use std::os::fd::OwnedFd;
use std::path::PathBuf;

/// Landlock ABI version of the running kernel, or `None` when Landlock is unavailable.
pub fn kernel_abi() -> Option<i32> {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
    // SAFETY: the version query takes no pointers (NULL attr, size 0) and has no side effect.
    let v = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<u8>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    (v > 0).then_some(v as i32)
}

fn abi_from(v: i32) -> ABI {
    match v {
        1 => ABI::V1,
        2 => ABI::V2,
        3 => ABI::V3,
        4 => ABI::V4,
        5 => ABI::V5,
        _ => ABI::V6,
    }
}

/// Paths a sandboxed run may read and write.
#[derive(Clone, Debug, Default)]
pub struct FsRules {
    /// Trees readable (and executable) by the run.
    pub read: Vec<PathBuf>,
    /// Trees readable and writable by the run.
    pub write: Vec<PathBuf>,
}

/// Builds a ruleset in the parent; the child only calls `landlock_restrict_self` on the fd.
pub fn build_ruleset(abi_version: i32, rules: &FsRules) -> Result<OwnedFd> {
    let abi = abi_from(abi_version);
    let err = |e: &dyn std::fmt::Display| SandboxError::Layer {
        layer: "landlock",
        reason: e.to_string(),
    };
    let mut ruleset = Ruleset::default()
        .handle_access(AccessFs::from_all(abi))
        .map_err(|e| err(&e))?;
    if abi_version >= 4 {
        ruleset = ruleset
            .handle_access(AccessNet::BindTcp | AccessNet::ConnectTcp)
            .map_err(|e| err(&e))?;
    }
    if abi_version >= 6 {
        ruleset = ruleset
            .scope(Scope::Signal | Scope::AbstractUnixSocket)
            .map_err(|e| err(&e))?;
    }
    let mut created = ruleset.create().map_err(|e| err(&e))?;
    let sets = [
        (&rules.read, AccessFs::from_read(abi)),
        (&rules.write, AccessFs::from_all(abi)),
    ];
    for (paths, access) in sets {
        for p in paths.iter().filter(|p| p.exists()) {
            let fd = PathFd::new(p).map_err(|e| err(&format!("{}: {e}", p.display())))?;
            created = created
                .add_rule(PathBeneath::new(fd, access))
                .map_err(|e| err(&format!("{}: {e}", p.display())))?;
        }
    }
    let fd: Option<OwnedFd> = created.into();
    fd.ok_or_else(|| err(&"kernel did not create a ruleset"))
}

//! Per-run storage bounds: a run's workspace (its repository copy and its `/tmp`) lives on its own
//! tmpfs, mounted with `size=` and `nr_inodes=`, so one run cannot exhaust the host's disk or
//! inodes however many files it writes. Mounting needs root (the common case: CI and most users);
//! elsewhere the layer is reported missing and only `RLIMIT_FSIZE` bounds each file.
//!
//! tmpfs pages are charged to the memory cgroup of the process that writes them, so what a run
//! stores also counts against its memory limit.

use serde::{Deserialize, Serialize};
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// Bounds on what one run may store in its workspace.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Quota {
    /// Total bytes of the workspace (repository copy, run's writes, its `/tmp`).
    pub bytes: u64,
    /// Total inodes (files, directories, links) of the workspace.
    pub files: u64,
}

/// How a workspace's storage is bounded.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct QuotaLayer {
    /// The tmpfs bounds in force, when the workspace is on its own tmpfs.
    pub tmpfs: Option<Quota>,
    /// Why it is not, when not.
    pub missing: Option<String>,
}

fn c_path(p: &Path) -> Result<CString, String> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| format!("{}: NUL in path", p.display()))
}

/// Mounts a tmpfs bounded by `q` on the existing directory `dir` (mode 0711, nosuid, nodev).
/// Fails (with the reason) without root or where the host refuses mounts.
pub fn mount(dir: &Path, q: &Quota) -> Result<(), String> {
    if q.bytes == 0 || q.files == 0 {
        return Err("the quota is zero".into());
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err("needs root to mount a per-run tmpfs".into());
    }
    let target = c_path(dir)?;
    let opts = CString::new(format!("size={},nr_inodes={},mode=0711", q.bytes, q.files))
        .map_err(|e| e.to_string())?;
    let fstype = c"tmpfs";
    // SAFETY: every pointer is a valid NUL-terminated string that outlives the call.
    let rc = unsafe {
        libc::mount(
            fstype.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV,
            opts.as_ptr().cast(),
        )
    };
    if rc != 0 {
        return Err(format!(
            "mount tmpfs on {}: {}",
            dir.display(),
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

/// Detaches the tmpfs mounted on `dir` (its contents vanish); a no-op when nothing is mounted.
pub fn unmount(dir: &Path) {
    if let Ok(target) = c_path(dir) {
        // SAFETY: a valid NUL-terminated path; EINVAL (not a mount point) is harmless.
        unsafe {
            libc::umount2(target.as_ptr(), libc::MNT_DETACH);
        }
    }
}

/// True when `dir` is a mount point (listed in `/proc/self/mountinfo`).
pub fn is_mounted(dir: &Path) -> bool {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    let want = dir.as_os_str().as_bytes();
    info.lines().any(|l| {
        l.split(' ')
            .nth(4)
            .is_some_and(|m| unescape_mountinfo(m).as_slice() == want)
    })
}

/// Mount points in mountinfo escape space, tab, newline and backslash as `\ooo`.
fn unescape_mountinfo(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() {
            if let Some(v) = std::str::from_utf8(&b[i + 1..i + 4])
                .ok()
                .and_then(|o| u8::from_str_radix(o, 8).ok())
            {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    out
}

/// Probes the layer on this host by mounting (and removing) a tiny tmpfs under `base`.
pub fn probe(base: &Path, q: &Quota) -> QuotaLayer {
    let dir = base.join(format!("sorft-quota-probe-{}", std::process::id()));
    if let Err(e) = std::fs::create_dir_all(&dir) {
        return QuotaLayer {
            tmpfs: None,
            missing: Some(format!("{}: {e}", dir.display())),
        };
    }
    let r = mount(&dir, q);
    unmount(&dir);
    let _ = std::fs::remove_dir(&dir);
    match r {
        Ok(()) => QuotaLayer {
            tmpfs: Some(*q),
            missing: None,
        },
        Err(e) => QuotaLayer {
            tmpfs: None,
            missing: Some(e),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes_are_decoded() {
        assert_eq!(unescape_mountinfo(r"/a\040b"), b"/a b".to_vec());
        assert_eq!(unescape_mountinfo(r"/plain"), b"/plain".to_vec());
        assert_eq!(unescape_mountinfo(r"/x\134"), b"/x\\".to_vec());
    }

    #[test]
    fn zero_quota_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let e = mount(
            d.path(),
            &Quota {
                bytes: 0,
                files: 10,
            },
        )
        .unwrap_err();
        assert!(e.contains("zero"), "{e}");
    }
}

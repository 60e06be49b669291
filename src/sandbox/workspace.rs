//! Private per-run workspaces: the repository copied into a scratch directory owned by the
//! run's sandbox uid, removed on drop (also on error and panic; on Ctrl-C via
//! [`crate::sandbox::cleanup`]).

use crate::sandbox::cleanup::{self, Tracked};
use crate::sandbox::error::{Result, SandboxError};
use crate::sandbox::isolation::JailPaths;
use crate::sandbox::limits::Limits;
use crate::sandbox::quota::{self, Quota, QuotaLayer};
use crate::sandbox::uid::UidSlot;
use crate::swe::repo::Snapshot;
use std::fs;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// Where a workspace's repository comes from.
#[derive(Clone, Copy, Debug)]
pub enum RepoSource<'a> {
    /// A directory holding the repository at the right commit (copied without `.git`).
    Dir(&'a Path),
    /// A commit's tree read from a git mirror.
    Snapshot(&'a Snapshot),
}

/// The default folder for workspaces: `/var/tmp/sorft-sandbox` when `/var/tmp` exists (a
/// workspace under `/tmp` would be hidden by the run's private `/tmp`), else the temp dir.
pub fn default_base() -> PathBuf {
    let var = Path::new("/var/tmp");
    if var.is_dir() {
        var.join("sorft-sandbox")
    } else {
        std::env::temp_dir().join("sorft-sandbox")
    }
}

/// One run's scratch directory: `root/repo` (the working copy) and `root/tmp`.
#[derive(Debug)]
pub struct Workspace {
    root: PathBuf,
    repo: PathBuf,
    tmp: PathBuf,
    slot: Option<UidSlot>,
    quota: QuotaLayer,
    _tracked: Tracked,
}

impl Workspace {
    /// Creates a workspace under `base` holding a copy of the directory `source` (without
    /// `.git`). As root, reserves a dedicated uid and hands the copy to it.
    pub fn create(base: &Path, source: &Path) -> Result<Workspace> {
        Workspace::create_from(base, RepoSource::Dir(source))
    }

    /// Creates a workspace under `base` holding `source`, bounded by the default limits' quota.
    pub fn create_from(base: &Path, source: RepoSource<'_>) -> Result<Workspace> {
        Workspace::create_with(base, source, Some(&Limits::default().quota()))
    }

    /// Creates a workspace under `base` holding `source`. With a `quota`, the workspace is its
    /// own tmpfs of that size and inode count where the host allows it (as root); otherwise it
    /// is a plain directory and [`Workspace::quota`] says why.
    pub fn create_with(
        base: &Path,
        source: RepoSource<'_>,
        quota: Option<&Quota>,
    ) -> Result<Workspace> {
        cleanup::install_signal_handlers();
        if cleanup::interrupted() {
            return Err(SandboxError::Interrupted);
        }
        if let RepoSource::Dir(dir) = source {
            if !dir.is_dir() {
                return Err(SandboxError::io(
                    format!("repository {}", dir.display()),
                    std::io::Error::new(std::io::ErrorKind::NotFound, "not a directory"),
                ));
            }
        }
        // SAFETY: geteuid has no preconditions.
        let slot = if unsafe { libc::geteuid() } == 0 {
            Some(UidSlot::acquire()?)
        } else {
            None
        };
        let name = format!(
            "sorft-ws-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let root = base.join(name);
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o711)
            .create(&root)
            .map_err(|e| SandboxError::io(format!("creating {}", root.display()), e))?;
        // From here on the directory is removed (and its tmpfs detached) on drop.
        let mut ws = Workspace {
            repo: root.join("repo"),
            tmp: root.join("tmp"),
            _tracked: cleanup::track_dir(root.clone()),
            root,
            slot,
            quota: QuotaLayer::default(),
        };
        ws.quota = match quota {
            None => QuotaLayer {
                tmpfs: None,
                missing: Some("no quota requested".into()),
            },
            Some(q) => match quota::mount(&ws.root, q) {
                Ok(()) => QuotaLayer {
                    tmpfs: Some(*q),
                    missing: None,
                },
                Err(e) => QuotaLayer {
                    tmpfs: None,
                    missing: Some(e),
                },
            },
        };
        // The umask could make the root unreachable for the sandbox uid.
        set_mode(&ws.root, 0o711)?;
        if ws.slot.is_some() {
            if let Some(blocked) = unreachable_ancestor(&ws.root) {
                return Err(SandboxError::io(
                    format!(
                        "workspace folder {} is not reachable by the sandbox uid ({} is not \
                         searchable by others); choose another work dir",
                        ws.root.display(),
                        blocked.display()
                    ),
                    std::io::Error::from(std::io::ErrorKind::PermissionDenied),
                ));
            }
        }
        match source {
            RepoSource::Dir(dir) => copy_tree(dir, &ws.repo)?,
            RepoSource::Snapshot(snap) => {
                fs::create_dir(&ws.repo)
                    .map_err(|e| SandboxError::io(format!("creating {}", ws.repo.display()), e))?;
                set_mode(&ws.repo, 0o755)?;
                snap.write_to(&ws.repo).map_err(|e| {
                    SandboxError::io(
                        format!("writing snapshot into {}", ws.repo.display()),
                        std::io::Error::other(e.to_string()),
                    )
                })?;
            }
        }
        fs::DirBuilder::new()
            .mode(0o700)
            .create(&ws.tmp)
            .map_err(|e| SandboxError::io(format!("creating {}", ws.tmp.display()), e))?;
        if let Some(s) = &ws.slot {
            chown_tree(&ws.repo, s.uid, s.gid)?;
            chown_tree(&ws.tmp, s.uid, s.gid)?;
        }
        Ok(ws)
    }

    /// The working copy of the repository.
    pub fn repo(&self) -> &Path {
        &self.repo
    }

    /// The run's private temp directory.
    pub fn tmp(&self) -> &Path {
        &self.tmp
    }

    /// How the workspace's storage is bounded (its own tmpfs, or why not).
    pub fn quota(&self) -> &QuotaLayer {
        &self.quota
    }

    /// The workspace root (removed on drop).
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The `(uid, gid)` the run executes as, when running as root.
    pub fn ids(&self) -> Option<(u32, u32)> {
        self.slot.as_ref().map(|s| (s.uid, s.gid))
    }

    /// Jail paths for a run in this workspace, with extra readable trees.
    pub fn jail_paths(&self, read: Vec<PathBuf>) -> JailPaths {
        JailPaths {
            repo: self.repo.clone(),
            tmp: self.tmp.clone(),
            read,
        }
    }

    /// Re-applies ownership after the host wrote files (e.g. applied a patch).
    pub fn hand_over(&self) -> Result<()> {
        if let Some(s) = &self.slot {
            chown_tree(&self.repo, s.uid, s.gid)?;
        }
        Ok(())
    }

    /// Hands the files the host wrote (repository-relative paths) and their folders to the
    /// run's uid; paths that no longer exist are skipped.
    pub fn hand_over_paths(&self, files: &[String]) -> Result<()> {
        let Some(s) = &self.slot else {
            return Ok(());
        };
        for f in files {
            let mut p = self.repo.join(f);
            while p.starts_with(&self.repo) && p != self.repo {
                if fs::symlink_metadata(&p).is_ok() {
                    std::os::unix::fs::lchown(&p, Some(s.uid), Some(s.gid))
                        .map_err(|e| SandboxError::io(format!("chown {}", p.display()), e))?;
                }
                if !p.pop() {
                    break;
                }
            }
        }
        Ok(())
    }
}

impl Drop for Workspace {
    fn drop(&mut self) {
        if self.quota.tmpfs.is_some() {
            quota::unmount(&self.root);
        }
        if fs::remove_dir_all(&self.root).is_err() {
            // A run may have removed permissions from its own directories.
            make_writable(&self.root);
            let _ = fs::remove_dir_all(&self.root);
        }
    }
}

/// The first ancestor of `p` that other users cannot search, if any.
fn unreachable_ancestor(p: &Path) -> Option<PathBuf> {
    let canon = p.canonicalize().ok()?;
    canon
        .ancestors()
        .find(|a| fs::metadata(a).is_ok_and(|m| m.permissions().mode() & 0o001 == 0))
        .map(Path::to_path_buf)
}

fn set_mode(p: &Path, mode: u32) -> Result<()> {
    fs::set_permissions(p, fs::Permissions::from_mode(mode))
        .map_err(|e| SandboxError::io(format!("chmod {}", p.display()), e))
}

fn make_writable(p: &Path) {
    if let Ok(m) = fs::symlink_metadata(p) {
        if m.is_dir() {
            let _ = fs::set_permissions(p, fs::Permissions::from_mode(0o700));
            if let Ok(rd) = fs::read_dir(p) {
                for e in rd.flatten() {
                    make_writable(&e.path());
                }
            }
        }
    }
}

/// Copies a tree (not `.git`), preserving modes and symlinks as links. Files are reflinked
/// where the filesystem allows and copied otherwise — never hardlinked, since the run may
/// change files in place and must not reach the mirror.
pub fn copy_tree(src: &Path, dst: &Path) -> Result<()> {
    let io = |what: &str, p: &Path, e| SandboxError::io(format!("{what} {}", p.display()), e);
    fs::create_dir(dst).map_err(|e| io("creating", dst, e))?;
    let mode = fs::metadata(src)
        .map_err(|e| io("reading", src, e))?
        .permissions();
    fs::set_permissions(dst, mode).map_err(|e| io("chmod", dst, e))?;
    for entry in fs::read_dir(src).map_err(|e| io("listing", src, e))? {
        let entry = entry.map_err(|e| io("listing", src, e))?;
        let name = entry.file_name();
        if name == ".git" {
            continue;
        }
        let from = entry.path();
        let to = dst.join(&name);
        let ft = entry.file_type().map_err(|e| io("reading", &from, e))?;
        if ft.is_dir() {
            copy_tree(&from, &to)?;
        } else if ft.is_symlink() {
            let target = fs::read_link(&from).map_err(|e| io("reading link", &from, e))?;
            std::os::unix::fs::symlink(target, &to).map_err(|e| io("creating link", &to, e))?;
        } else if ft.is_file() {
            copy_file(&from, &to).map_err(|e| io("copying", &from, e))?;
        }
    }
    Ok(())
}

fn copy_file(from: &Path, to: &Path) -> std::io::Result<()> {
    let src = fs::File::open(from)?;
    let dst = fs::File::create(to)?;
    // SAFETY: FICLONE takes the source descriptor as its argument; both fds are open.
    let cloned = unsafe { libc::ioctl(dst.as_raw_fd(), libc::FICLONE, src.as_raw_fd()) } == 0;
    drop(dst);
    if !cloned {
        fs::copy(from, to)?;
    } else {
        fs::set_permissions(to, src.metadata()?.permissions())?;
    }
    Ok(())
}

/// Changes the owner of every entry of a tree (symlinks themselves, not their targets).
pub fn chown_tree(p: &Path, uid: u32, gid: u32) -> Result<()> {
    std::os::unix::fs::lchown(p, Some(uid), Some(gid))
        .map_err(|e| SandboxError::io(format!("chown {}", p.display()), e))?;
    let m = fs::symlink_metadata(p)
        .map_err(|e| SandboxError::io(format!("stat {}", p.display()), e))?;
    if m.is_dir() {
        for e in
            fs::read_dir(p).map_err(|e| SandboxError::io(format!("listing {}", p.display()), e))?
        {
            let e = e.map_err(|e| SandboxError::io(format!("listing {}", p.display()), e))?;
            chown_tree(&e.path(), uid, gid)?;
        }
    }
    Ok(())
}

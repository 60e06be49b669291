//! Repository snapshots from local git mirrors (`--repos DIR` with `DIR/owner__name`), offline.
//!
//! A [`Snapshot`] is the tree of one commit read straight from git objects with the `git` CLI
//! (`ls-tree` + `cat-file --batch`); [`Snapshot::write_to`] materialises it into a scratch folder.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Errors reading a repository snapshot.
#[derive(Debug, thiserror::Error)]
pub enum RepoError {
    /// No mirror for the repository under the `--repos` folder.
    #[error("no git mirror for {repo} at {path}")]
    MissingMirror {
        /// `owner/name`.
        repo: String,
        /// Where it was looked for.
        path: PathBuf,
    },
    /// A git command failed.
    #[error("git {args} in {dir}: {msg}")]
    Git {
        /// The git arguments.
        args: String,
        /// The repository.
        dir: PathBuf,
        /// git's stderr (first line) or the I/O error.
        msg: String,
    },
    /// Writing the snapshot failed.
    #[error("{path}: {error}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        error: std::io::Error,
    },
}

/// The `--repos` folder: one git repository (bare or not) per `owner__name`.
#[derive(Debug, Clone)]
pub struct RepoStore {
    root: PathBuf,
}

impl RepoStore {
    /// A store rooted at `root`.
    pub fn new(root: impl Into<PathBuf>) -> RepoStore {
        RepoStore { root: root.into() }
    }

    /// The root folder.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The mirror folder of `owner/name`.
    pub fn mirror_path(&self, repo: &str) -> PathBuf {
        self.root.join(crate::swe::instance::repo_dir_name(repo))
    }

    /// Reads the tree of `commit` in the mirror of `repo`.
    pub fn snapshot(&self, repo: &str, commit: &str) -> Result<Snapshot, RepoError> {
        let path = self.mirror_path(repo);
        if !path.exists() {
            return Err(RepoError::MissingMirror {
                repo: repo.to_string(),
                path,
            });
        }
        Snapshot::from_git(&path, commit)
    }

    /// Materialises `commit` of `repo` into `dest` (created if missing).
    pub fn checkout(&self, repo: &str, commit: &str, dest: &Path) -> Result<Snapshot, RepoError> {
        let snap = self.snapshot(repo, commit)?;
        snap.write_to(dest)?;
        Ok(snap)
    }
}

/// One file of a snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotFile {
    /// Raw contents.
    pub bytes: Vec<u8>,
    /// Executable bit (git mode 100755).
    pub executable: bool,
}

/// The files of one commit, by repository-relative path (`/`-separated), in sorted order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// Path -> file.
    pub files: BTreeMap<String, SnapshotFile>,
}

fn run_git(dir: &Path, args: &[&str], stdin: Option<&[u8]>) -> Result<Vec<u8>, RepoError> {
    let err = |msg: String| RepoError::Git {
        args: args.join(" "),
        dir: dir.to_path_buf(),
        msg,
    };
    let mut child = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .env("GIT_TERMINAL_PROMPT", "0")
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| err(e.to_string()))?;
    let writer = match (stdin, child.stdin.take()) {
        (Some(data), Some(mut pipe)) => {
            let data = data.to_vec();
            Some(std::thread::spawn(move || pipe.write_all(&data)))
        }
        _ => None,
    };
    let mut out = Vec::new();
    if let Some(mut so) = child.stdout.take() {
        so.read_to_end(&mut out).map_err(|e| err(e.to_string()))?;
    }
    let mut errtext = String::new();
    if let Some(mut se) = child.stderr.take() {
        let _ = se.read_to_string(&mut errtext);
    }
    let status = child.wait().map_err(|e| err(e.to_string()))?;
    if let Some(w) = writer {
        let _ = w.join();
    }
    if !status.success() {
        let first = errtext.lines().next().unwrap_or("failed").to_string();
        return Err(err(first));
    }
    Ok(out)
}

impl Snapshot {
    /// Reads the tree of `commit` from the git repository at `repo_dir` (no network, no checkout).
    pub fn from_git(repo_dir: &Path, commit: &str) -> Result<Snapshot, RepoError> {
        let tree = format!("{commit}^{{tree}}");
        let listing = run_git(
            repo_dir,
            &["ls-tree", "-r", "-z", "--full-tree", &tree],
            None,
        )?;
        let mut entries = Vec::new();
        let mut request = Vec::new();
        for rec in listing.split(|&b| b == 0).filter(|r| !r.is_empty()) {
            // "<mode> <type> <oid>\t<path>"
            let rec = String::from_utf8_lossy(rec);
            let Some((meta, path)) = rec.split_once('\t') else {
                continue;
            };
            let mut parts = meta.split(' ');
            let (Some(mode), Some(kind), Some(oid)) = (parts.next(), parts.next(), parts.next())
            else {
                continue;
            };
            if kind != "blob" || mode == "120000" {
                continue; // submodules and symlinks are not source files
            }
            request.extend_from_slice(oid.as_bytes());
            request.push(b'\n');
            entries.push((path.to_string(), mode == "100755"));
        }
        let mut files = BTreeMap::new();
        if entries.is_empty() {
            return Ok(Snapshot { files });
        }
        let data = run_git(repo_dir, &["cat-file", "--batch"], Some(&request))?;
        let mut pos = 0usize;
        for (path, executable) in entries {
            let bad = || RepoError::Git {
                args: "cat-file --batch".into(),
                dir: repo_dir.to_path_buf(),
                msg: format!("unexpected output for {path}"),
            };
            let nl = data[pos..]
                .iter()
                .position(|&b| b == b'\n')
                .ok_or_else(bad)?;
            let header = String::from_utf8_lossy(&data[pos..pos + nl]).to_string();
            let size: usize = header
                .rsplit(' ')
                .next()
                .and_then(|s| s.parse().ok())
                .ok_or_else(bad)?;
            let start = pos + nl + 1;
            let end = start + size;
            if end > data.len() {
                return Err(bad());
            }
            files.insert(
                path,
                SnapshotFile {
                    bytes: data[start..end].to_vec(),
                    executable,
                },
            );
            pos = end + 1; // trailing LF after each object
        }
        Ok(Snapshot { files })
    }

    /// The contents of `path` as text, if the file exists and is UTF-8.
    pub fn text(&self, path: &str) -> Option<&str> {
        self.files
            .get(path)
            .and_then(|f| std::str::from_utf8(&f.bytes).ok())
    }

    /// All paths, sorted.
    pub fn paths(&self) -> impl Iterator<Item = &str> {
        self.files.keys().map(|s| s.as_str())
    }

    /// Builds a snapshot from in-memory text files (tests, generators).
    pub fn from_texts<I, P, T>(files: I) -> Snapshot
    where
        I: IntoIterator<Item = (P, T)>,
        P: Into<String>,
        T: Into<String>,
    {
        Snapshot {
            files: files
                .into_iter()
                .map(|(p, t)| {
                    (
                        p.into(),
                        SnapshotFile {
                            bytes: t.into().into_bytes(),
                            executable: false,
                        },
                    )
                })
                .collect(),
        }
    }

    /// Writes every file under `dest`, creating folders as needed.
    pub fn write_to(&self, dest: &Path) -> Result<(), RepoError> {
        for (path, file) in &self.files {
            let full = dest.join(path);
            let io = |error| RepoError::Io {
                path: full.clone(),
                error,
            };
            if let Some(parent) = full.parent() {
                std::fs::create_dir_all(parent).map_err(io)?;
            }
            std::fs::write(&full, &file.bytes).map_err(io)?;
            #[cfg(unix)]
            if file.executable {
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(&full, std::fs::Permissions::from_mode(0o755))
                    .map_err(io)?;
            }
        }
        Ok(())
    }
}

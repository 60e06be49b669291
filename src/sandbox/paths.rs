//! Path safety for patches: everything a patch names must stay inside the repository.

use std::path::{Component, Path, PathBuf};

/// Why a path is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("refused path {path:?}: {reason}")]
pub struct UnsafePath {
    /// The path as written in the patch.
    pub path: String,
    /// Why.
    pub reason: &'static str,
}

fn refuse(path: &str, reason: &'static str) -> UnsafePath {
    UnsafePath {
        path: path.to_string(),
        reason,
    }
}

/// Checks a repository-relative path syntactically: not empty, not absolute, no `..`, not
/// inside `.git/`.
pub fn check_relative(path: &str) -> Result<(), UnsafePath> {
    if path.is_empty() {
        return Err(refuse(path, "empty path"));
    }
    if path.contains('\0') {
        return Err(refuse(path, "NUL byte in path"));
    }
    let p = Path::new(path);
    for c in p.components() {
        match c {
            Component::RootDir | Component::Prefix(_) => {
                return Err(refuse(path, "absolute path"));
            }
            Component::ParentDir => return Err(refuse(path, "`..` component")),
            Component::Normal(n) if n.eq_ignore_ascii_case(".git") => {
                return Err(refuse(path, "touches .git/"));
            }
            _ => {}
        }
    }
    Ok(())
}

/// Resolves `rel` under `root` for writing: checks it syntactically, then refuses it when an
/// existing component is a symlink leading outside the repository, or when the file itself is
/// a symlink (a write would go through it).
pub fn resolve_for_write(root: &Path, rel: &str) -> Result<PathBuf, UnsafePath> {
    check_relative(rel)?;
    let canon_root = root
        .canonicalize()
        .map_err(|_| refuse(rel, "repository root cannot be resolved"))?;
    let mut cur = root.to_path_buf();
    let comps: Vec<Component> = Path::new(rel).components().collect();
    for (i, c) in comps.iter().enumerate() {
        cur.push(c.as_os_str());
        let Ok(meta) = std::fs::symlink_metadata(&cur) else {
            // Components from here on do not exist yet and will be created as directories.
            break;
        };
        if meta.file_type().is_symlink() {
            if i + 1 == comps.len() {
                return Err(refuse(rel, "writes through a symlink"));
            }
            match cur.canonicalize() {
                Ok(t) if t.starts_with(&canon_root) => {}
                _ => {
                    return Err(refuse(
                        rel,
                        "goes through a symlink pointing outside the repository",
                    ))
                }
            }
        }
    }
    Ok(root.join(rel))
}

/// Checks that a symlink placed at `link` (repository-relative) with `target` stays inside
/// the repository, judged lexically.
pub fn check_symlink_target(link: &str, target: &str) -> Result<(), UnsafePath> {
    let t = Path::new(target.trim_end_matches(['\n', '\r']));
    if t.is_absolute() {
        return Err(refuse(link, "creates a symlink to an absolute path"));
    }
    let mut depth: i64 = Path::new(link).components().count() as i64 - 1;
    for c in t.components() {
        match c {
            Component::ParentDir => depth -= 1,
            Component::Normal(n) => {
                if n.eq_ignore_ascii_case(".git") {
                    return Err(refuse(link, "creates a symlink into .git/"));
                }
                depth += 1
            }
            Component::CurDir => {}
            _ => return Err(refuse(link, "creates a symlink to an absolute path")),
        }
        if depth < 0 {
            return Err(refuse(
                link,
                "creates a symlink pointing outside the repository",
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn syntactic_checks() {
        assert!(check_relative("a/b.py").is_ok());
        assert!(check_relative("./a/b.py").is_ok());
        assert_eq!(
            check_relative("/etc/passwd").unwrap_err().reason,
            "absolute path"
        );
        assert_eq!(
            check_relative("a/../../x").unwrap_err().reason,
            "`..` component"
        );
        assert_eq!(
            check_relative(".git/config").unwrap_err().reason,
            "touches .git/"
        );
        assert_eq!(
            check_relative("sub/.GIT/hooks/x").unwrap_err().reason,
            "touches .git/"
        );
        assert!(check_relative("").is_err());
    }

    #[test]
    fn symlink_targets() {
        assert!(check_symlink_target("a/link", "../b").is_ok());
        assert!(check_symlink_target("a/link", "../../b").is_err());
        assert!(check_symlink_target("link", "/").is_err());
        assert!(check_symlink_target("link", "x/../../..").is_err());
    }

    #[test]
    fn symlinks_on_disk() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("repo");
        std::fs::create_dir_all(root.join("inner")).unwrap();
        std::os::unix::fs::symlink("/", root.join("out")).unwrap();
        std::os::unix::fs::symlink("inner", root.join("in")).unwrap();
        assert!(resolve_for_write(&root, "in/x.py").is_ok());
        assert!(resolve_for_write(&root, "out/etc/passwd").is_err());
        assert!(resolve_for_write(&root, "in").is_err());
        assert!(resolve_for_write(&root, "new/dir/file").is_ok());
    }
}

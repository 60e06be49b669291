//! Choosing the Python interpreter (or virtualenv) that runs the tests.

use crate::sandbox::error::{Result, SandboxError};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// An interpreter and the trees the sandbox must be able to read for it to work.
#[derive(Clone, Debug, PartialEq)]
pub struct Interpreter {
    /// The program to run (a virtualenv's `bin/python` is kept as is, not resolved).
    pub program: PathBuf,
    /// Trees to make readable: the interpreter's prefix, the virtualenv.
    pub read_roots: Vec<PathBuf>,
}

/// True when "others" can reach and execute `p` (every ancestor directory searchable).
fn world_executable(p: &Path) -> bool {
    let Ok(canon) = p.canonicalize() else {
        return false;
    };
    let mut ok = std::fs::metadata(&canon).is_ok_and(|m| m.permissions().mode() & 0o001 != 0);
    let mut dir = canon.parent();
    while let (true, Some(d)) = (ok, dir) {
        ok = std::fs::metadata(d).is_ok_and(|m| m.permissions().mode() & 0o001 != 0);
        dir = d.parent();
    }
    ok
}

fn prefix_of(program: &Path) -> Vec<PathBuf> {
    let mut roots = vec![];
    if let Ok(canon) = program.canonicalize() {
        // .../bin/python3.11 -> ... (the installation prefix holding lib/pythonX.Y).
        if let Some(prefix) = canon.parent().and_then(Path::parent) {
            if prefix != Path::new("/") {
                roots.push(prefix.to_path_buf());
            } else if let Some(bin) = canon.parent() {
                roots.push(bin.to_path_buf());
            }
        }
    }
    roots
}

/// Resolves the interpreter: `explicit` may name a python binary or a virtualenv directory;
/// otherwise `python3` on `PATH` (then `/usr/bin/python3`). With `sandbox_uid`, interpreters
/// inside directories that other users cannot enter (such as `/root`) are skipped.
pub fn resolve(explicit: Option<&Path>, sandbox_uid: bool) -> Result<Interpreter> {
    if let Some(p) = explicit {
        return explicit_interpreter(p, sandbox_uid);
    }
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|v| std::env::split_paths(&v).collect())
        .unwrap_or_default();
    dirs.push("/usr/bin".into());
    dirs.push("/usr/local/bin".into());
    let mut private = None;
    for d in dirs {
        let cand = d.join("python3");
        if !cand.is_file() {
            continue;
        }
        if sandbox_uid && !world_executable(&cand) {
            private.get_or_insert(cand);
            continue;
        }
        // Shims (pyenv) are scripts that need the caller's environment; run the real binary.
        let program = cand.canonicalize().unwrap_or(cand);
        let read_roots = prefix_of(&program);
        return Ok(Interpreter {
            program,
            read_roots,
        });
    }
    Err(SandboxError::Interpreter(match private {
        Some(p) => format!(
            "{} is inside a directory the sandbox uid cannot enter; pass --python with an \
             interpreter or virtualenv under a world-readable path",
            p.display()
        ),
        None => "no python3 found on PATH or in /usr/bin; install python3 or pass --python".into(),
    }))
}

fn explicit_interpreter(p: &Path, sandbox_uid: bool) -> Result<Interpreter> {
    let (program, venv) = if p.is_dir() {
        let bin = ["bin/python", "bin/python3"]
            .iter()
            .map(|b| p.join(b))
            .find(|b| b.is_file())
            .ok_or_else(|| {
                SandboxError::Interpreter(format!(
                    "{} is a directory without bin/python (not a virtualenv)",
                    p.display()
                ))
            })?;
        (bin, Some(p.to_path_buf()))
    } else if p.is_file() {
        (p.to_path_buf(), None)
    } else {
        return Err(SandboxError::Interpreter(format!(
            "{} does not exist",
            p.display()
        )));
    };
    if sandbox_uid && !world_executable(&program) {
        return Err(SandboxError::Interpreter(format!(
            "{} is not executable by the sandbox uid (check the permissions of its directories)",
            program.display()
        )));
    }
    let mut read_roots = prefix_of(&program);
    if let Some(v) = venv {
        let program = std::path::absolute(&program).unwrap_or(program);
        read_roots.push(std::path::absolute(&v).unwrap_or(v));
        return Ok(Interpreter {
            program,
            read_roots,
        });
    }
    Ok(Interpreter {
        program: std::path::absolute(&program).unwrap_or(program),
        read_roots,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_explicit_interpreter_is_a_clear_error() {
        let e = resolve(Some(Path::new("/nonexistent/python9")), false).unwrap_err();
        assert!(e.to_string().contains("does not exist"), "{e}");
    }

    #[test]
    fn directory_without_python_is_not_a_venv() {
        let d = tempfile::tempdir().unwrap();
        let e = resolve(Some(d.path()), false).unwrap_err();
        assert!(e.to_string().contains("not a virtualenv"), "{e}");
    }
}

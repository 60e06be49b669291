//! The `sorft` command-line entry point: parses arguments and dispatches to `sorft::cli`.

mod cli;

use clap::Parser;

fn main() {
    sorft::engine::cpu::heap::keep_freed_buffers();
    let args = cli::Cli::parse();
    cli::init_logging(args.verbose);
    if let Some(t) = args.threads {
        // A second initialisation can only fail if something already built the pool; ignore that.
        let _ = rayon::ThreadPoolBuilder::new()
            .num_threads(t)
            .build_global();
    }
    match cli::run(args.command) {
        Ok(()) => {}
        // A reader that stopped reading (`sorft model info DIR | head`) is not a failure.
        Err(e) if cli::is_broken_pipe(&e) => {}
        Err(e) => {
            // One line: the error and its causes joined, never a panic or a backtrace.
            eprintln!("error: {}", cli::one_line(&e));
            std::process::exit(1);
        }
    }
}

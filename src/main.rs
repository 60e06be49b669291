//! The `sorft` command-line entry point: parses arguments and dispatches to `sorft::cli`.

mod cli;

use clap::Parser;

fn main() {
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
        Err(e) => {
            // One line: the error and its causes joined, never a panic or a backtrace.
            let msg = e
                .chain()
                .map(|c| c.to_string())
                .collect::<Vec<_>>()
                .join(": ");
            eprintln!("error: {msg}");
            std::process::exit(1);
        }
    }
}

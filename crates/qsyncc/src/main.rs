//! `qsyncc`: the qsync command-line driver (the command is `qsyncc::cli`).

fn main() -> std::process::ExitCode {
    std::process::ExitCode::from(qsyncc::cli::main(std::env::args_os()))
}

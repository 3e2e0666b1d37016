//! The `inferscope` command; the commands themselves are the library's [`inferscope::cli`].

fn main() -> std::process::ExitCode {
    inferscope::cli::main()
}

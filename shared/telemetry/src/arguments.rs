//! What a service binary does with its command line: its settings are environment variables,
//! so it takes no arguments but `--version` and `--help`, which answer at once (before any
//! setting is read or connection made), as an image's smoke test or an operator expects.

/// Answers `--version` / `-V` (`<name> <version>`) and `--help` / `-h` (`about`, then where the
/// settings are documented) and exits 0; any other argument exits 2, saying the binary takes
/// none. Returns when there are no arguments. Call it first in `main`.
pub fn answer(name: &str, about: &str) {
    let arguments: Vec<String> = std::env::args().skip(1).collect();
    let Some(first) = arguments.first() else {
        return;
    };
    match first.as_str() {
        "--version" | "-V" => {
            println!("{name} {}", env!("CARGO_PKG_VERSION"));
            std::process::exit(0);
        }
        "--help" | "-h" => {
            println!(
                "{name} {}: {about}\n\nUsage: {name}\n\nIt takes no arguments: every setting is an environment variable (docs/configuration.md). --version prints the version.",
                env!("CARGO_PKG_VERSION")
            );
            std::process::exit(0);
        }
        other => {
            eprintln!(
                "{name}: unexpected argument {other:?}: it takes none (its settings are environment variables, docs/configuration.md); --help says more"
            );
            std::process::exit(2);
        }
    }
}

//! One file per subcommand; `main.rs` parses arguments and maps errors to
//! exit codes.
pub mod inspect;

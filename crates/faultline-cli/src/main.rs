//! The `faultline` command.
fn main() {}

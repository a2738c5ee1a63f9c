//! One module per subcommand.

pub mod taxonomy;

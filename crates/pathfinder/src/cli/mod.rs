//! One module per subcommand.

pub mod agents;
pub mod corpus;
pub mod detect;
pub mod eval;
pub mod inject;
pub mod model;
pub mod run;
pub mod serve;
pub mod taxonomy;
pub mod traces;

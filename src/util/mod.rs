//! Small helpers with no home in a layer: they import nothing of sparkrt.

pub mod files;
pub mod rng;

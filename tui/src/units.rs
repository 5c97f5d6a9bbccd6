//! Byte figures as the monitor prints them: the shared rule of
//! `sparkrt_wire::units` (the CLI prints by the same one), in binary (KiB…) or
//! decimal (kB…) units; `u` toggles between them.

pub use sparkrt_wire::units::ByteUnits as Units;

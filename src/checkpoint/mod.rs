//! Safetensors checkpoints: mapped once, validated completely, viewed in place.
pub mod linear;

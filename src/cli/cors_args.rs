//! `serve`'s cross-origin flags, under vLLM's names, into the server's
//! [`CorsPolicy`].

use anyhow::{Result, bail};

use crate::server::cors::{Allowed, CorsPolicy, parse_allowed};

#[derive(Debug, Default, clap::Args)]
pub struct CorsArgs {
    /// Origins whose browser pages may call the API: a JSON list (vLLM's
    /// form, '["http://localhost:3000"]') or comma-separated; "*" any.
    /// Default: none, and no CORS headers at all (vLLM allows every
    /// origin by default; sparkrt leaves it to you).
    #[arg(long, value_name = "LIST")]
    pub allowed_origins: Option<String>,
    /// Methods allowed cross-origin (with --allowed-origins) [default: "*"].
    #[arg(long, value_name = "LIST")]
    pub allowed_methods: Option<String>,
    /// Request headers allowed cross-origin (with --allowed-origins)
    /// [default: "*"].
    #[arg(long, value_name = "LIST")]
    pub allowed_headers: Option<String>,
    /// Let cross-origin pages send credentials (the origin is then echoed,
    /// never "*").
    #[arg(long)]
    pub allow_credentials: bool,
}

impl CorsArgs {
    /// The policy, or none without `--allowed-origins`; the other flags
    /// without it are refused (they would change nothing).
    pub fn policy(&self) -> Result<Option<CorsPolicy>> {
        let Some(origins) = &self.allowed_origins else {
            for (given, flag) in [
                (self.allowed_methods.is_some(), "--allowed-methods"),
                (self.allowed_headers.is_some(), "--allowed-headers"),
                (self.allow_credentials, "--allow-credentials"),
            ] {
                if given {
                    bail!("{flag} needs --allowed-origins: without it no CORS headers are sent");
                }
            }
            return Ok(None);
        };
        let list = |value: &Option<String>, flag: &str, case: fn(&str) -> String| {
            match value {
                None => Ok(Allowed::Any),
                Some(text) => parse_allowed(text, flag).map(|allowed| match allowed {
                    Allowed::Any => Allowed::Any,
                    Allowed::Only(list) => Allowed::Only(list.iter().map(|s| case(s)).collect()),
                }),
            }
            .map_err(anyhow::Error::msg)
        };
        Ok(Some(CorsPolicy {
            origins: parse_allowed(origins, "--allowed-origins").map_err(anyhow::Error::msg)?,
            methods: list(
                &self.allowed_methods,
                "--allowed-methods",
                str::to_ascii_uppercase,
            )?,
            headers: list(
                &self.allowed_headers,
                "--allowed-headers",
                str::to_ascii_lowercase,
            )?,
            credentials: self.allow_credentials,
        }))
    }
}

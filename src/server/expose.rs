//! Where `serve` listens and whether it may do so without an API key:
//! `--host` is resolved and checked before the model loads, and a
//! non-loopback address without a key is refused unless the operator says
//! `--insecure-no-api-key`.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, ToSocketAddrs};

use thiserror::Error;

#[derive(Debug, Error)]
pub enum ExposureError {
    #[error("--host {host:?} is neither an IP address nor a host name that resolves: {why}")]
    Unresolvable { host: String, why: String },
    #[error(
        "--host {host} listens on {address}, which is not loopback, and no --api-key-file is \
         given: anyone who reaches port {port} could use the model. Pass --api-key-file FILE, \
         or --insecure-no-api-key to serve without a key all the same"
    )]
    NoKey {
        host: String,
        address: IpAddr,
        port: u16,
    },
}

/// The address `--host host --port port` names: an IPv4 or IPv6 literal
/// (brackets allowed), `localhost` (always 127.0.0.1), or a host name,
/// resolved (its first address).
pub fn resolve(host: &str, port: u16) -> Result<SocketAddr, ExposureError> {
    let bare = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    if let Ok(ip) = bare.parse::<IpAddr>() {
        return Ok(SocketAddr::new(ip, port));
    }
    if bare.eq_ignore_ascii_case("localhost") {
        return Ok(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port));
    }
    let unresolvable = |why: String| ExposureError::Unresolvable {
        host: host.to_string(),
        why,
    };
    if bare.is_empty() || bare.contains(['[', ']', '/', ' ']) {
        return Err(unresolvable("not a host name".to_string()));
    }
    (bare, port)
        .to_socket_addrs()
        .map_err(|e| unresolvable(e.to_string()))?
        .next()
        .ok_or_else(|| unresolvable("it has no addresses".to_string()))
}

/// Loopback addresses, IPv4-mapped ones included.
pub fn is_loopback(ip: IpAddr) -> bool {
    ip.to_canonical().is_loopback()
}

/// What listening on `address` asks for: `Ok(false)` is fine, `Ok(true)`
/// is allowed but must be warned about (no key, told to go ahead).
pub fn check(
    host: &str,
    address: SocketAddr,
    has_key: bool,
    insecure_no_api_key: bool,
) -> Result<bool, ExposureError> {
    if has_key || is_loopback(address.ip()) {
        return Ok(false);
    }
    if insecure_no_api_key {
        return Ok(true);
    }
    Err(ExposureError::NoKey {
        host: host.to_string(),
        address: address.ip(),
        port: address.port(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_in_every_spelling_resolve() {
        let v6 = "::1".parse::<IpAddr>().unwrap();
        assert_eq!(resolve("::1", 80).unwrap().ip(), v6);
        assert_eq!(resolve("[::1]", 80).unwrap().ip(), v6);
        assert_eq!(resolve("127.0.0.1", 80).unwrap().port(), 80);
        assert_eq!(
            resolve("LocalHost", 80).unwrap().ip(),
            IpAddr::V4(Ipv4Addr::LOCALHOST)
        );
        assert_eq!(resolve("0.0.0.0", 1).unwrap().ip().to_string(), "0.0.0.0");
        assert!(resolve("", 1).is_err());
        assert!(resolve("[::1", 1).is_err());
        assert!(resolve("no such host.invalid", 1).is_err());
    }

    #[test]
    fn non_loopback_needs_a_key_or_the_insecure_flag() {
        let any = resolve("0.0.0.0", 8000).unwrap();
        let err = check("0.0.0.0", any, false, false).unwrap_err();
        assert!(err.to_string().contains("--insecure-no-api-key"), "{err}");
        assert!(!check("0.0.0.0", any, true, false).unwrap());
        assert!(check("0.0.0.0", any, false, true).unwrap());
        for host in [
            "127.0.0.1",
            "127.0.0.2",
            "::1",
            "::ffff:127.0.0.1",
            "localhost",
        ] {
            let address = resolve(host, 1).unwrap();
            assert!(!check(host, address, false, false).unwrap(), "{host}");
        }
        let v6_any = resolve("::", 1).unwrap();
        assert!(check("::", v6_any, false, false).is_err());
    }
}

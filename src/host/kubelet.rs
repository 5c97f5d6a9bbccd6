//! The kubelet's memory reservations, read from its configuration file
//! (`KubeletConfiguration` YAML): what the node keeps back from pods and the
//! eviction line below which it starts killing them.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_yaml_ng::Value;

use super::error::{HostError, read_host_file};
use crate::units::parse_bytes;

/// The kubelet's own default for `evictionHard["memory.available"]`.
pub const DEFAULT_EVICTION_HARD: &str = "100Mi";

/// `evictionHard["memory.available"]`: absolute, or a share of MemTotal.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EvictionThreshold {
    Bytes(u64),
    /// Parts per million of MemTotal (exact for percentages with up to four decimals).
    PercentPpm(u64),
}

impl EvictionThreshold {
    /// The threshold in bytes for a host with `mem_total` bytes (a
    /// percentage is truncated to whole bytes, as the kubelet does).
    pub fn bytes(self, mem_total: u64) -> u64 {
        match self {
            EvictionThreshold::Bytes(b) => b,
            EvictionThreshold::PercentPpm(ppm) => {
                (u128::from(mem_total) * u128::from(ppm) / 1_000_000) as u64
            }
        }
    }
}

impl std::fmt::Display for EvictionThreshold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EvictionThreshold::Bytes(b) => write!(f, "{b} bytes"),
            EvictionThreshold::PercentPpm(ppm) => {
                write!(f, "{}% of MemTotal", *ppm as f64 / 10_000.0)
            }
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KubeletReservations {
    pub config_path: PathBuf,
    /// `systemReserved.memory`, bytes (0 when unset).
    pub system_reserved: u64,
    /// `kubeReserved.memory`, bytes (0 when unset).
    pub kube_reserved: u64,
    pub eviction_hard: EvictionThreshold,
}

/// Reads and parses a kubelet configuration file.
pub fn read(path: &Path) -> Result<KubeletReservations, HostError> {
    let text = read_host_file(path)?;
    parse(&text, path)
}

pub fn parse(text: &str, path: &Path) -> Result<KubeletReservations, HostError> {
    let file = path.display().to_string();
    let doc: Value = serde_yaml_ng::from_str(text).map_err(|e| {
        let (line, column) = e
            .location()
            .map(|l| (l.line(), l.column()))
            .unwrap_or((0, 0));
        HostError::Yaml {
            file: file.clone(),
            line,
            column,
            why: e.to_string(),
        }
    })?;
    if !doc.is_mapping() {
        return Err(HostError::Inconsistent {
            file,
            why: "a kubelet configuration must be a YAML mapping".to_string(),
        });
    }
    let memory_of = |section: &str| -> Result<u64, HostError> {
        match doc.get(section).and_then(|s| s.get("memory")) {
            None | Some(Value::Null) => Ok(0),
            Some(v) => parse_quantity_value(v, &file, &format!("{section}.memory")),
        }
    };
    let system_reserved = memory_of("systemReserved")?;
    let kube_reserved = memory_of("kubeReserved")?;
    let eviction_hard = match doc
        .get("evictionHard")
        .and_then(|e| e.get("memory.available"))
    {
        None | Some(Value::Null) => EvictionThreshold::Bytes(
            parse_bytes(DEFAULT_EVICTION_HARD).unwrap_or(100 * 1024 * 1024),
        ),
        Some(v) => parse_threshold(v, &file)?,
    };
    Ok(KubeletReservations {
        config_path: path.to_path_buf(),
        system_reserved,
        kube_reserved,
        eviction_hard,
    })
}

fn value_text(v: &Value, file: &str, key: &str) -> Result<String, HostError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Number(n) => Ok(n.to_string()),
        _ => Err(HostError::Inconsistent {
            file: file.to_string(),
            why: format!("{key} must be a quantity such as \"2Gi\", found {v:?}"),
        }),
    }
}

fn parse_quantity_value(v: &Value, file: &str, key: &str) -> Result<u64, HostError> {
    let text = value_text(v, file, key)?;
    parse_bytes(&text).map_err(|e| HostError::Quantity {
        file: file.to_string(),
        key: key.to_string(),
        source: e,
    })
}

fn parse_threshold(v: &Value, file: &str) -> Result<EvictionThreshold, HostError> {
    const KEY: &str = "evictionHard[\"memory.available\"]";
    let text = value_text(v, file, KEY)?;
    let Some(percent) = text.trim().strip_suffix('%') else {
        return parse_quantity_value(v, file, KEY).map(EvictionThreshold::Bytes);
    };
    let bad = || HostError::Inconsistent {
        file: file.to_string(),
        why: format!("{KEY} = {text:?} is not a percentage between 0% and 100%"),
    };
    let ppm = percent_to_ppm(percent.trim()).ok_or_else(bad)?;
    if ppm > 1_000_000 {
        return Err(bad());
    }
    Ok(EvictionThreshold::PercentPpm(ppm))
}

/// `"7.5"` → 75_000 parts per million; at most four decimals.
fn percent_to_ppm(text: &str) -> Option<u64> {
    let (int_part, frac_part) = text.split_once('.').unwrap_or((text, ""));
    if (int_part.is_empty() && frac_part.is_empty()) || frac_part.len() > 4 {
        return None;
    }
    let all_digits = |s: &str| s.chars().all(|c| c.is_ascii_digit());
    if !all_digits(int_part) || !all_digits(frac_part) {
        return None;
    }
    let whole: u64 = if int_part.is_empty() {
        0
    } else {
        int_part.parse().ok()?
    };
    let frac: u64 = format!("{frac_part:0<4}").parse().ok()?;
    whole.checked_mul(10_000)?.checked_add(frac)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_text(text: &str) -> Result<KubeletReservations, HostError> {
        parse(text, Path::new("/var/lib/kubelet/config.yaml"))
    }

    #[test]
    fn reservations_and_percentage_eviction() {
        let k = parse_text(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nsystemReserved:\n  cpu: 500m\n  memory: 2Gi\nkubeReserved:\n  memory: 1536Mi\nevictionHard:\n  memory.available: \"5%\"\n  nodefs.available: \"10%\"\n",
        )
        .unwrap();
        assert_eq!(k.system_reserved, 2 << 30);
        assert_eq!(k.kube_reserved, 1536 << 20);
        assert_eq!(k.eviction_hard, EvictionThreshold::PercentPpm(50_000));
        assert_eq!(k.eviction_hard.bytes(1_000_000_001), 50_000_000);
    }

    #[test]
    fn defaults_when_unset_and_plain_numbers() {
        let k = parse_text("kind: KubeletConfiguration\nsystemReserved:\n  memory: 1073741824\n")
            .unwrap();
        assert_eq!(k.system_reserved, 1 << 30);
        assert_eq!(k.kube_reserved, 0);
        assert_eq!(k.eviction_hard, EvictionThreshold::Bytes(100 << 20));
    }

    #[test]
    fn fractional_percent_and_absolute_threshold() {
        let k = parse_text("evictionHard:\n  memory.available: 7.5%\n").unwrap();
        assert_eq!(k.eviction_hard.bytes(1000), 75);
        let k = parse_text("evictionHard:\n  memory.available: 500Mi\n").unwrap();
        assert_eq!(k.eviction_hard, EvictionThreshold::Bytes(500 << 20));
    }

    #[test]
    fn bad_configs_are_errors() {
        assert!(matches!(
            parse_text("systemReserved: [unclosed\n"),
            Err(HostError::Yaml { .. })
        ));
        assert!(parse_text("- just\n- a list\n").is_err());
        let err = parse_text("kubeReserved:\n  memory: 3Zi\n").unwrap_err();
        assert!(err.to_string().contains("kubeReserved.memory"), "{err}");
        assert!(parse_text("evictionHard:\n  memory.available: 150%\n").is_err());
        assert!(parse_text("evictionHard:\n  memory.available: \"x%\"\n").is_err());
        assert!(parse_text("evictionHard:\n  memory.available: [1]\n").is_err());
    }
}

//! Which workers may be added while the router runs
//! (`server.worker_allowlist`).
//!
//! The admin API lets a key holder point the router at any server; an
//! allowlist narrows that to the operator's own networks and names, so a
//! leaked admin key cannot turn the router into a proxy to anywhere. Every
//! source of workers at runtime goes through the control task's `add`, which
//! applies [`Allowlist::check`]; workers from the config file and flags are
//! trusted (the operator wrote them) and are not checked.
//!
//! Matching never touches DNS: a decision made on a resolved address could
//! be changed by whoever controls the name's records, and resolving on the
//! control path would stall it. So an IP-literal URL is matched against the
//! CIDR entries, a named URL against the name entries, as written
//! (case-insensitively), and a named URL against an allowlist of CIDRs only
//! is refused.

use crate::config::ConfigError;
use crate::error::GatewayError;
use radixgate_routing::WorkerUrl;
use std::fmt;
use std::net::IpAddr;

/// The parsed `server.worker_allowlist`; empty allows every worker.
#[derive(Clone, Debug, Default)]
pub struct Allowlist {
    rules: Vec<Rule>,
}

#[derive(Clone, Debug, PartialEq)]
enum Rule {
    /// An address block; `net` has its host bits cleared.
    Network { net: IpAddr, prefix: u8 },
    /// A host name, lower-cased.
    Name(String),
    /// `*.suffix`: any name ending in `.suffix` (one or more labels in
    /// front of it, so `*.svc.cluster.local` takes `w.ns.svc.cluster.local`);
    /// stored lower-cased with its leading dot.
    Suffix(String),
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Network { net, prefix } => write!(f, "{net}/{prefix}"),
            Self::Name(name) => f.write_str(name),
            Self::Suffix(suffix) => write!(f, "*{suffix}"),
        }
    }
}

const KEY: &str = "server.worker_allowlist";

impl Allowlist {
    /// Parses the entries; the error names the entry and what is wrong.
    pub fn parse(entries: &[String]) -> Result<Self, ConfigError> {
        let rules = entries
            .iter()
            .enumerate()
            .map(|(i, entry)| {
                Rule::parse(entry.trim()).map_err(|reason| ConfigError::Invalid {
                    key: KEY,
                    reason: format!("entry {i} `{entry}`: {reason}"),
                })
            })
            .collect::<Result<_, _>>()?;
        Ok(Self { rules })
    }

    /// Whether any entry is set.
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// Accepts `url` if the allowlist is empty or one entry matches it; the
    /// refusal (a 403) names the entries and why none applies.
    pub fn check(&self, url: &WorkerUrl) -> Result<(), GatewayError> {
        if self.rules.is_empty() || self.rules.iter().any(|rule| rule.matches(url)) {
            return Ok(());
        }
        let (networks, names): (Vec<&Rule>, Vec<&Rule>) = self
            .rules
            .iter()
            .partition(|rule| matches!(rule, Rule::Network { .. }));
        let list = |rules: &[&Rule]| {
            rules
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        };
        let reason = match url.ip() {
            Some(ip) if networks.is_empty() => format!(
                "its host {ip} is an IP address and the allowlist has only host names ({})",
                list(&names)
            ),
            Some(ip) => format!("{ip} is in none of {}", list(&networks)),
            None if names.is_empty() => format!(
                "its host `{}` is a name and the allowlist has only networks ({}); \
                 names are not resolved to check them",
                url.host(),
                list(&networks)
            ),
            None => format!("`{}` matches none of {}", url.host(), list(&names)),
        };
        Err(GatewayError::WorkerNotAllowed {
            url: url.to_string(),
            reason,
        })
    }
}

impl Rule {
    fn parse(entry: &str) -> Result<Self, String> {
        if entry.is_empty() {
            return Err("is empty".into());
        }
        if entry.contains("://") {
            return Err("must be a network or a host name, not a URL".into());
        }
        if let Some((addr, prefix)) = entry.split_once('/') {
            let addr: IpAddr = addr
                .parse()
                .map_err(|_| format!("`{addr}` is not an IP address"))?;
            let bits = if addr.is_ipv4() { 32 } else { 128 };
            let prefix = prefix
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= bits)
                .ok_or_else(|| format!("the prefix length must be 0 to {bits}"))?;
            let (addr, prefix) = ipv4_mapped(addr, prefix);
            return Ok(Self::Network {
                net: masked(addr, prefix),
                prefix,
            });
        }
        if let Ok(addr) = entry.parse::<IpAddr>() {
            let prefix = if addr.is_ipv4() { 32 } else { 128 };
            let (net, prefix) = ipv4_mapped(addr, prefix);
            return Ok(Self::Network { net, prefix });
        }
        let (name, wildcard) = match entry.strip_prefix("*.") {
            Some(suffix) => (suffix, true),
            None => (entry, false),
        };
        // A name is whatever the worker URL rule takes as a host name (and
        // no port, which that rule would take, `:80` even unwritten).
        let checked = WorkerUrl::parse(&format!("http://{name}")).ok();
        if name.contains(':')
            || !checked.is_some_and(|url| url.ip().is_none() && url.port().is_none())
        {
            return Err(
                "must be a CIDR (10.0.0.0/8), an IP address, a host name or `*.` and a \
                 host name (*.svc.cluster.local)"
                    .into(),
            );
        }
        let name = name.to_ascii_lowercase();
        Ok(if wildcard {
            Self::Suffix(format!(".{name}"))
        } else {
            Self::Name(name)
        })
    }

    fn matches(&self, url: &WorkerUrl) -> bool {
        match (self, url.ip()) {
            (Self::Network { net, prefix }, Some(ip)) => {
                // `[::ffff:10.0.0.1]` is 10.0.0.1 to the network.
                let ip = ip.to_canonical();
                ip.is_ipv4() == net.is_ipv4() && masked(ip, *prefix) == *net
            }
            (Self::Name(name), None) => url.host().eq_ignore_ascii_case(name),
            (Self::Suffix(suffix), None) => {
                let host = url.host().to_ascii_lowercase();
                host.len() > suffix.len() && host.ends_with(suffix.as_str())
            }
            _ => false,
        }
    }
}

/// An IPv4-mapped block (`::ffff:10.0.0.0/104`, `::ffff:10.0.0.1`) as the
/// IPv4 block it is (`10.0.0.0/8`, `10.0.0.1/32`): a worker's address is
/// matched as IPv4 where it is one (see [`Rule::matches`]), and a mapped
/// entry would match none. A block wider than the mapped range is kept.
fn ipv4_mapped(addr: IpAddr, prefix: u8) -> (IpAddr, u8) {
    match addr {
        IpAddr::V6(v6) if prefix >= 96 => match v6.to_ipv4_mapped() {
            Some(v4) => (IpAddr::V4(v4), prefix - 96),
            None => (addr, prefix),
        },
        _ => (addr, prefix),
    }
}

/// `addr` with all but its first `prefix` bits cleared (`prefix` at most
/// the family's width, as [`Rule::parse`] ensures).
fn masked(addr: IpAddr, prefix: u8) -> IpAddr {
    match addr {
        IpAddr::V4(v4) => {
            let mask = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
            IpAddr::V4((u32::from(v4) & mask).into())
        }
        IpAddr::V6(v6) => {
            let mask = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
            IpAddr::V6((u128::from(v6) & mask).into())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(entries: &[&str]) -> Allowlist {
        Allowlist::parse(&entries.iter().map(|e| (*e).to_owned()).collect::<Vec<_>>()).unwrap()
    }

    fn allowed(list: &Allowlist, url: &str) -> Result<(), String> {
        list.check(&WorkerUrl::parse(url).unwrap())
            .map_err(|e| e.to_string())
    }

    /// An entry written IPv4-mapped is the IPv4 block it maps, as a
    /// worker's address written so is its IPv4 address.
    #[test]
    fn ipv4_mapped_entries_are_their_ipv4_blocks() {
        let l = list(&["::ffff:10.0.0.1", "::ffff:192.168.0.0/112"]);
        for ok in [
            "http://10.0.0.1:8000",
            "http://[::ffff:10.0.0.1]:8000",
            "http://192.168.3.4",
        ] {
            assert_eq!(allowed(&l, ok), Ok(()), "{ok}");
        }
        for bad in ["http://10.0.0.2", "http://192.169.0.1"] {
            assert!(allowed(&l, bad).is_err(), "{bad}");
        }
        let err = allowed(&l, "http://10.0.0.2").unwrap_err();
        assert!(err.contains("10.0.0.1/32, 192.168.0.0/16"), "{err}");
    }

    #[test]
    fn networks_take_ip_literals_only() {
        let l = list(&["10.0.0.0/8", "192.168.1.7", "fd00::/8"]);
        for ok in [
            "http://10.1.2.3:8000",
            "http://10.255.255.255",
            "http://192.168.1.7:1",
            "http://[fd00::5]:30000",
            "http://[::ffff:10.0.0.1]:1",
        ] {
            assert_eq!(allowed(&l, ok), Ok(()), "{ok}");
        }
        for (bad, why) in [
            (
                "http://11.0.0.1",
                "11.0.0.1 is in none of 10.0.0.0/8, 192.168.1.7/32, fd00::/8",
            ),
            ("http://192.168.1.8", "none of"),
            ("http://[fe80::1]", "none of"),
            (
                "http://localhost:1",
                "is a name and the allowlist has only networks",
            ),
            ("http://w.svc.cluster.local", "names are not resolved"),
        ] {
            let err = allowed(&l, bad).unwrap_err();
            assert!(
                err.contains("server.worker_allowlist") && err.contains(why),
                "{bad}: {err}"
            );
        }
        // Host bits in an entry are ignored; /0 takes its whole family.
        let l = list(&["10.1.2.3/8", "0.0.0.0/0"]);
        assert_eq!(allowed(&l, "http://8.8.8.8"), Ok(()));
        assert!(allowed(&l, "http://[::1]").is_err());
    }

    #[test]
    fn names_match_as_written() {
        let l = list(&["*.svc.cluster.local", "Worker-1.Example"]);
        for ok in [
            "http://sglang.ns.svc.cluster.local:30000",
            "http://a.SVC.cluster.local",
            "https://worker-1.example:443",
        ] {
            assert_eq!(allowed(&l, ok), Ok(()), "{ok}");
        }
        for (bad, why) in [
            (
                "http://svc.cluster.local",
                "matches none of *.svc.cluster.local, worker-1.example",
            ),
            ("http://evilsvc.cluster.local", "matches none"),
            ("http://svc.cluster.local.evil", "matches none"),
            ("http://worker-1.example.evil", "matches none"),
            (
                "http://127.0.0.1:1",
                "is an IP address and the allowlist has only host names",
            ),
        ] {
            let err = allowed(&l, bad).unwrap_err();
            assert!(err.contains(why), "{bad}: {err}");
        }
    }

    #[test]
    fn an_empty_list_allows_everything() {
        let l = list(&[]);
        assert!(l.is_empty());
        assert_eq!(allowed(&l, "http://anything:1"), Ok(()));
    }

    #[test]
    fn bad_entries_are_named() {
        for (bad, why) in [
            ("", "is empty"),
            ("10.0.0.0/33", "prefix length must be 0 to 32"),
            ("fd00::/129", "0 to 128"),
            ("10.0.0/8", "not an IP address"),
            ("*", "must be a CIDR"),
            ("*.", "must be a CIDR"),
            ("a.*.b", "must be a CIDR"),
            ("http://a", "not a URL"),
            ("a:80", "must be a CIDR"),
            ("a b", "must be a CIDR"),
        ] {
            let err = Allowlist::parse(&["10.0.0.0/8".into(), bad.into()])
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("server.worker_allowlist")
                    && err.contains("entry 1")
                    && err.contains(why),
                "{bad:?}: {err}"
            );
        }
    }
}

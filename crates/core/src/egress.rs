//! The egress address filter: which addresses an outbound request may reach. Shared by the
//! `http.fetch` tool and the dispatcher's webhook sender, so both refuse the same ranges.
//!
//! Addresses are checked after resolution, against the addresses actually connected to
//! ([`CheckedResolver`]: the client connects only to what the check let through, so a name cannot
//! resolve twice): loopback, private, link-local, CGNAT, multicast, reserved and cloud-metadata
//! ranges, in IPv4 and IPv6 with IPv4-mapped, -compatible, NAT64 and 6to4 forms, are refused
//! unless an address entry of the [`Policy`] covers them.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

/// Which ports an entry allows.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Ports {
    /// 80 and 443.
    Default,
    One(u16),
    Any,
}

impl Ports {
    pub fn allows(self, port: u16) -> bool {
        match self {
            Ports::Default => port == 80 || port == 443,
            Ports::One(p) => p == port,
            Ports::Any => true,
        }
    }
}

/// What an entry names.
#[derive(Debug, Clone, PartialEq)]
pub enum Target {
    /// An exact host name, lower-cased.
    Host(String),
    /// `*.domain`: the domain's subdomains.
    Subdomains(String),
    /// An address range; a single address is a /32 or /128.
    Net(IpAddr, u8),
}

/// One allowlist entry.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub target: Target,
    pub ports: Ports,
}

/// An allowlist entry that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("http allowlist entry `{entry}`: {why}")]
pub struct AllowlistError {
    entry: String,
    why: &'static str,
}

/// An address refused after resolution.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{ip} is {range}, which is refused unless the allowlist names it")]
pub struct RefusedAddress {
    ip: IpAddr,
    range: &'static str,
}

impl Entry {
    pub fn parse(text: &str) -> Result<Entry, AllowlistError> {
        let text = text.trim().to_ascii_lowercase();
        let bad = |why: &'static str| Err(AllowlistError { entry: text.clone(), why });
        // `[v6]:port`, `v4:port`, `name:port`, or no port at all.
        let (host, port) = if let Some(rest) = text.strip_prefix('[') {
            match rest.split_once(']') {
                Some((host, "")) => (host.to_owned(), None),
                Some((host, port)) => match port.strip_prefix(':') {
                    Some(port) => (host.to_owned(), Some(port.to_owned())),
                    None => return bad("expected `[address]:port`"),
                },
                None => return bad("unclosed `[`"),
            }
        } else if text.matches(':').count() == 1 {
            let (host, port) = text.split_once(':').unwrap_or((&text, ""));
            (host.to_owned(), Some(port.to_owned()))
        } else {
            (text.clone(), None)
        };
        let ports = match port.as_deref() {
            None => Ports::Default,
            Some("*") => Ports::Any,
            Some(port) => match port.parse::<u16>() {
                Ok(p) if p > 0 => Ports::One(p),
                _ => return bad("the port must be 1-65535 or `*`"),
            },
        };
        let target = if let Some((addr, bits)) = host.split_once('/') {
            let Ok(addr) = addr.parse::<IpAddr>() else { return bad("not an address range") };
            let max = if addr.is_ipv4() { 32 } else { 128 };
            match bits.parse::<u8>() {
                Ok(bits) if bits <= max => Target::Net(addr, bits),
                _ => return bad("bad prefix length"),
            }
        } else if let Ok(addr) = host.parse::<IpAddr>() {
            Target::Net(addr, if addr.is_ipv4() { 32 } else { 128 })
        } else if let Some(domain) = host.strip_prefix("*.") {
            Target::Subdomains(domain.to_owned())
        } else if host.is_empty() {
            return bad("no host");
        } else {
            Target::Host(host)
        };
        Ok(Entry { target, ports })
    }

    pub fn matches_host(&self, host: &url::Host<&str>) -> bool {
        match (&self.target, host) {
            (Target::Host(name), url::Host::Domain(h)) => h.eq_ignore_ascii_case(name),
            (Target::Subdomains(domain), url::Host::Domain(h)) => {
                h.to_ascii_lowercase().ends_with(&format!(".{domain}"))
            }
            (Target::Net(..), url::Host::Ipv4(ip)) => self.covers(IpAddr::V4(*ip)),
            (Target::Net(..), url::Host::Ipv6(ip)) => self.covers(IpAddr::V6(*ip)),
            _ => false,
        }
    }

    /// Whether this is an address entry covering `ip`.
    pub fn covers(&self, ip: IpAddr) -> bool {
        let Target::Net(net, bits) = self.target else { return false };
        match (net, canonical(ip)) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = if bits == 0 { 0 } else { u32::MAX << (32 - u32::from(bits)) };
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = if bits == 0 { 0 } else { u128::MAX << (128 - u32::from(bits)) };
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }
}

/// An IPv6 address that embeds an IPv4 one (mapped, compatible, NAT64, 6to4) as that IPv4.
pub fn canonical(ip: IpAddr) -> IpAddr {
    let IpAddr::V6(v6) = ip else { return ip };
    if let Some(v4) = v6.to_ipv4_mapped() {
        return IpAddr::V4(v4);
    }
    let bits = u128::from(v6);
    let low32 = Ipv4Addr::from((bits & 0xffff_ffff) as u32);
    let segments = v6.segments();
    // ::a.b.c.d (deprecated IPv4-compatible), but not :: and ::1 themselves.
    if bits >> 32 == 0 && bits > 1 {
        return IpAddr::V4(low32);
    }
    // 64:ff9b::/96 (NAT64) and 64:ff9b:1::/48 (local NAT64).
    if bits >> 32 == 0x0064_ff9b_0000_0000_0000_0000
        || (segments[0] == 0x64 && segments[1] == 0xff9b && segments[2] == 1)
    {
        return IpAddr::V4(low32);
    }
    // 2002:AABB:CCDD::/48 (6to4) embeds AA.BB.CC.DD.
    if segments[0] == 0x2002 {
        return IpAddr::V4(Ipv4Addr::from(((u32::from(segments[1])) << 16) | u32::from(segments[2])));
    }
    ip
}

/// Why `ip` may not be reached without an explicit entry, or `None` when it is public.
pub fn refused_range(ip: IpAddr) -> Option<&'static str> {
    match canonical(ip) {
        IpAddr::V4(v4) => {
            let [a, b, c, _] = v4.octets();
            Some(match (a, b, c) {
                (0, ..) => "this-network (0.0.0.0/8)",
                (10, ..) => "private (10.0.0.0/8)",
                (100, 64..=127, _) => "shared CGNAT (100.64.0.0/10)",
                (127, ..) => "loopback (127.0.0.0/8)",
                (169, 254, _) => "link-local and cloud metadata (169.254.0.0/16)",
                (172, 16..=31, _) => "private (172.16.0.0/12)",
                (192, 0, 0) => "IETF protocol assignments (192.0.0.0/24)",
                (192, 0, 2) | (198, 51, 100) | (203, 0, 113) => "documentation",
                (192, 168, _) => "private (192.168.0.0/16)",
                (198, 18..=19, _) => "benchmarking (198.18.0.0/15)",
                (224..=239, ..) => "multicast (224.0.0.0/4)",
                (240..=255, ..) => "reserved or broadcast (240.0.0.0/4)",
                _ => return None,
            })
        }
        IpAddr::V6(v6) => {
            let first = v6.segments()[0];
            Some(if v6 == Ipv6Addr::UNSPECIFIED {
                "unspecified (::)"
            } else if v6 == Ipv6Addr::LOCALHOST {
                "loopback (::1)"
            } else if first & 0xfe00 == 0xfc00 {
                "unique local and cloud metadata (fc00::/7)"
            } else if first & 0xffc0 == 0xfe80 {
                "link-local (fe80::/10)"
            } else if first & 0xffc0 == 0xfec0 {
                "site-local (fec0::/10)"
            } else if first & 0xff00 == 0xff00 {
                "multicast (ff00::/8)"
            } else if first == 0x2001 && v6.segments()[1] == 0x0db8 {
                "documentation (2001:db8::/32)"
            } else if first == 0x0100 && v6.segments()[1..4] == [0, 0, 0] {
                "discard (100::/64)"
            } else {
                return None;
            })
        }
    }
}

/// The parsed allowlist, shared by the tool, its resolver and its redirect policy.
#[derive(Debug, Default)]
pub struct Policy {
    pub entries: Vec<Entry>,
}

impl Policy {
    /// Whether `ip` may be connected to: public, or covered by an address entry.
    pub fn address_ok(&self, ip: IpAddr) -> Result<(), RefusedAddress> {
        match refused_range(ip) {
            None => Ok(()),
            Some(_) if self.entries.iter().any(|e| e.covers(ip)) => Ok(()),
            Some(range) => Err(RefusedAddress { ip, range }),
        }
    }

    /// Checks a URL whose host is an address literal, which no resolver sees: a name is checked
    /// by [`CheckedResolver`] when it is resolved. A URL with a name passes here.
    pub fn literal_ok(&self, url: &url::Url) -> Result<(), RefusedAddress> {
        match url.host() {
            Some(url::Host::Ipv4(ip)) => self.address_ok(IpAddr::V4(ip)),
            Some(url::Host::Ipv6(ip)) => self.address_ok(IpAddr::V6(ip)),
            _ => Ok(()),
        }
    }

    /// A client that connects only to what `policy` allows (names through [`CheckedResolver`];
    /// literals are the caller's to check with [`Policy::literal_ok`]), with no proxy and
    /// `timeout` per request. The caller adds its redirect policy.
    pub fn client(policy: &Arc<Policy>, timeout: std::time::Duration) -> reqwest::ClientBuilder {
        reqwest::Client::builder()
            .timeout(timeout)
            .no_proxy()
            .dns_resolver(Arc::new(CheckedResolver(policy.clone())))
    }
}

/// Resolves names and keeps only the addresses the policy allows; the client connects to no other.
pub struct CheckedResolver(pub Arc<Policy>);

impl reqwest::dns::Resolve for CheckedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let policy = self.0.clone();
        Box::pin(async move {
            let host = name.as_str().to_owned();
            let resolved: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let mut refusals = Vec::new();
            let allowed: Vec<SocketAddr> = resolved
                .into_iter()
                .filter(|addr| match policy.address_ok(addr.ip()) {
                    Ok(()) => true,
                    Err(why) => {
                        refusals.push(why.to_string());
                        false
                    }
                })
                .collect();
            if allowed.is_empty() {
                let why = if refusals.is_empty() { "no address".to_owned() } else { refusals.join("; ") };
                return Err(format!("refused address for `{host}`: {why}").into());
            }
            Ok(Box::new(allowed.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

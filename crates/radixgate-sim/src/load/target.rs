//! Target base URLs, checked once at start-up.

use crate::SimError;

/// A server to send requests to: `http://host:port`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    base: String,
}

impl Target {
    /// Parses a base URL. Only `http` is supported (no TLS), and the URL
    /// must not carry a path, query or fragment beyond `/`.
    pub fn parse(url: &str) -> Result<Self, SimError> {
        let bad = |reason: &str| SimError::BadUrl {
            url: url.to_owned(),
            reason: reason.to_owned(),
        };
        let uri: http::Uri = url
            .parse()
            .map_err(|e: http::uri::InvalidUri| bad(&e.to_string()))?;
        match uri.scheme_str() {
            Some("http") => {}
            Some("https") => {
                return Err(bad("https is not supported; this tool speaks plain HTTP"));
            }
            Some(_) => return Err(bad("the scheme must be http")),
            None => return Err(bad("missing scheme; write http://host:port")),
        }
        let Some(authority) = uri.authority() else {
            return Err(bad("missing host"));
        };
        if authority.host().is_empty() {
            return Err(bad("missing host"));
        }
        if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
            return Err(bad("give the server's base URL, without a path or query"));
        }
        Ok(Self {
            base: format!("http://{authority}"),
        })
    }

    /// The base URL, `http://host:port`.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// The URI of `path` on this target.
    pub fn uri(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_base_urls_and_explains_rejections() {
        assert_eq!(
            Target::parse("http://127.0.0.1:3000/").unwrap().base(),
            "http://127.0.0.1:3000"
        );
        assert_eq!(
            Target::parse("http://localhost:8")
                .unwrap()
                .uri("/generate"),
            "http://localhost:8/generate"
        );
        for (url, why) in [
            ("https://x:1", "https"),
            ("127.0.0.1:80", "scheme"),
            ("ftp://x", "http"),
            ("http://x:1/v1", "path"),
            ("http://x:1/?a=b", "path"),
            ("http://", ""),
            ("not a url", ""),
        ] {
            match Target::parse(url) {
                Err(SimError::BadUrl { reason, .. }) => {
                    assert!(reason.contains(why), "{url}: {reason}")
                }
                other => panic!("{url}: {other:?}"),
            }
        }
    }
}

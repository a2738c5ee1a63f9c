//! Which Debian archive to bootstrap from: read from this machine's apt configuration, so that
//! no host name is ever written into the repository.

use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum AptError {
    #[error("{path}: cannot read: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("no `deb` source for suite {suite:?} in the apt configuration under {root} (looked at {looked}); configure one, or set PATHFINDER_DEBIAN_MIRROR to the archive URL")]
    NoSource {
        suite: String,
        root: PathBuf,
        looked: String,
    },
}

/// One `deb` source: an archive URI and the suites it serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AptSource {
    pub uri: String,
    pub suites: Vec<String>,
    /// Where it was configured (`file:line`).
    pub origin: String,
}

/// Parses deb822 `.sources` text (stanzas separated by blank lines).
pub fn parse_deb822(text: &str, file: &str) -> Vec<AptSource> {
    let mut out = Vec::new();
    let mut stanza: Vec<(usize, &str)> = Vec::new();
    let mut flush = |stanza: &mut Vec<(usize, &str)>| {
        let field = |name: &str| {
            stanza.iter().find_map(|(_, l)| {
                let (k, v) = l.split_once(':')?;
                k.trim()
                    .eq_ignore_ascii_case(name)
                    .then(|| v.trim().to_owned())
            })
        };
        let types = field("Types").unwrap_or_default();
        let enabled = field("Enabled").is_none_or(|v| !v.eq_ignore_ascii_case("no"));
        if enabled && types.split_whitespace().any(|t| t == "deb") {
            let suites: Vec<String> = field("Suites")
                .unwrap_or_default()
                .split_whitespace()
                .map(str::to_owned)
                .collect();
            let line = stanza.first().map(|(n, _)| *n).unwrap_or(0);
            for uri in field("URIs").unwrap_or_default().split_whitespace() {
                out.push(AptSource {
                    uri: uri.to_owned(),
                    suites: suites.clone(),
                    origin: format!("{file}:{line}"),
                });
            }
        }
        stanza.clear();
    };
    for (i, line) in text.lines().enumerate() {
        let t = line.trim();
        if t.is_empty() {
            flush(&mut stanza);
        } else if !t.starts_with('#') && !line.starts_with(' ') && !line.starts_with('\t') {
            stanza.push((i + 1, t));
        }
    }
    flush(&mut stanza);
    out
}

/// Parses one-line-style `sources.list` text: `deb [options] URI SUITE COMPONENT...`.
pub fn parse_one_line(text: &str, file: &str) -> Vec<AptSource> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        let mut rest = match line.strip_prefix("deb ") {
            Some(r) => r.trim_start(),
            None => continue,
        };
        if rest.starts_with('[') {
            match rest.find(']') {
                Some(end) => rest = rest[end + 1..].trim_start(),
                None => continue,
            }
        }
        let mut words = rest.split_whitespace();
        if let (Some(uri), Some(suite)) = (words.next(), words.next()) {
            out.push(AptSource {
                uri: uri.to_owned(),
                suites: vec![suite.to_owned()],
                origin: format!("{file}:{}", i + 1),
            });
        }
    }
    out
}

/// All `deb` sources configured under `root` (normally `/etc/apt`).
pub fn sources(root: &Path) -> Result<Vec<AptSource>, AptError> {
    let mut out = Vec::new();
    let list = root.join("sources.list");
    if list.is_file() {
        let text = std::fs::read_to_string(&list).map_err(|source| AptError::Read {
            path: list.clone(),
            source,
        })?;
        out.extend(parse_one_line(&text, &list.display().to_string()));
    }
    let dir = root.join("sources.list.d");
    if let Ok(entries) = std::fs::read_dir(&dir) {
        let mut paths: Vec<PathBuf> = entries.filter_map(Result::ok).map(|e| e.path()).collect();
        paths.sort();
        for path in paths {
            let ext = path.extension().and_then(|e| e.to_str());
            if !matches!(ext, Some("sources" | "list")) {
                continue;
            }
            let text = std::fs::read_to_string(&path).map_err(|source| AptError::Read {
                path: path.clone(),
                source,
            })?;
            let name = path.display().to_string();
            if ext == Some("sources") {
                out.extend(parse_deb822(&text, &name));
            } else {
                out.extend(parse_one_line(&text, &name));
            }
        }
    }
    Ok(out)
}

/// The archive URI to bootstrap `suite` from: `PATHFINDER_DEBIAN_MIRROR` if set, else the
/// first http(s) or file `deb` source under `root` that serves `suite`.
pub fn mirror_for(root: &Path, suite: &str) -> Result<AptSource, AptError> {
    if let Ok(uri) = std::env::var("PATHFINDER_DEBIAN_MIRROR") {
        if !uri.trim().is_empty() {
            return Ok(AptSource {
                uri: uri.trim().to_owned(),
                suites: vec![suite.to_owned()],
                origin: "PATHFINDER_DEBIAN_MIRROR".into(),
            });
        }
    }
    let all = sources(root)?;
    all.iter()
        .find(|s| {
            s.suites.iter().any(|x| x == suite)
                && ["http://", "https://", "file:/"]
                    .iter()
                    .any(|p| s.uri.starts_with(p))
        })
        .cloned()
        .ok_or_else(|| AptError::NoSource {
            suite: suite.to_owned(),
            root: root.to_owned(),
            looked: if all.is_empty() {
                "no deb sources at all".into()
            } else {
                all.iter()
                    .map(|s| format!("{} {}", s.origin, s.suites.join(",")))
                    .collect::<Vec<_>>()
                    .join("; ")
            },
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deb822_stanzas() {
        let text = "Types: deb\n# comment\nURIs: http://mirror.example/debian\nSuites: bookworm bookworm-updates\nComponents: main\n\nTypes: deb\nURIs: http://mirror.example/debian-security\nSuites: bookworm-security\n\nTypes: deb-src\nURIs: http://src.example/\nSuites: bookworm\n\nTypes: deb\nEnabled: no\nURIs: http://off.example/\nSuites: bookworm\n";
        let s = parse_deb822(text, "x.sources");
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].uri, "http://mirror.example/debian");
        assert_eq!(s[0].suites, ["bookworm", "bookworm-updates"]);
        assert_eq!(s[0].origin, "x.sources:1");
        assert_eq!(s[1].suites, ["bookworm-security"]);
    }

    #[test]
    fn one_line_sources() {
        let text = "# c\ndeb [arch=amd64 signed-by=/k.gpg] http://a.example/debian bookworm main\ndeb-src http://b.example/ bookworm main\ndeb http://c.example/debian bookworm-updates main # tail\n";
        let s = parse_one_line(text, "sources.list");
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].uri, "http://a.example/debian");
        assert_eq!(s[0].origin, "sources.list:2");
        assert_eq!(s[1].suites, ["bookworm-updates"]);
    }

    #[test]
    fn mirror_picks_the_suite_and_reports_what_it_saw() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join("sources.list.d")).unwrap();
        std::fs::write(
            root.path().join("sources.list.d/debian.sources"),
            "Types: deb\nURIs: http://sec.example/\nSuites: bookworm-security\n\nTypes: deb\nURIs: http://main.example/debian\nSuites: bookworm\n",
        )
        .unwrap();
        if std::env::var_os("PATHFINDER_DEBIAN_MIRROR").is_none() {
            assert_eq!(
                mirror_for(root.path(), "bookworm").unwrap().uri,
                "http://main.example/debian"
            );
            let e = mirror_for(root.path(), "trixie").unwrap_err().to_string();
            assert!(
                e.contains("trixie") && e.contains("debian.sources:1"),
                "{e}"
            );
        }
    }
}

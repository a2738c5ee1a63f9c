//! The LLM endpoint an episode may reach, always as a host Unix socket: the scripted server
//! in-process, an external Unix socket, or a forwarder from a socket to an external TCP
//! endpoint (so that sandboxes keep no network even when the model is served over HTTP).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use agents::{Endpoint, Llm, Workspace};

#[derive(Debug, thiserror::Error)]
pub enum EndpointError {
    #[error("cannot start the scripted LLM server: {0}")]
    Scripted(String),
    #[error("--llm {url:?}: {reason}")]
    Url { url: String, reason: String },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Which endpoint to use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LlmChoice {
    Scripted,
    /// `unix:/path` or `http://HOST:PORT`.
    Url(String),
}

impl LlmChoice {
    /// `scripted` or a URL.
    pub fn parse(text: &str) -> Result<LlmChoice, EndpointError> {
        let bad = |reason: &str| EndpointError::Url {
            url: text.to_owned(),
            reason: reason.to_owned(),
        };
        if text == "scripted" {
            Ok(LlmChoice::Scripted)
        } else if let Some(path) = text.strip_prefix("unix:") {
            if path.starts_with('/') {
                Ok(LlmChoice::Url(text.to_owned()))
            } else {
                Err(bad("a unix: URL needs an absolute socket path"))
            }
        } else if let Some(rest) = text.strip_prefix("http://") {
            let authority = rest.trim_end_matches('/');
            match authority.rsplit_once(':') {
                Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() && !authority.contains('/') => {
                    Ok(LlmChoice::Url(format!("http://{authority}")))
                }
                _ => Err(bad("expected http://HOST:PORT (no path; requests go to {base}/v1/chat/completions)")),
            }
        } else {
            Err(bad("expected `scripted`, unix:/path/to/socket or http://HOST:PORT (https is not supported)"))
        }
    }
}

enum Inner {
    Scripted(#[allow(dead_code)] Endpoint),
    Forwarder {
        task: tokio::task::JoinHandle<()>,
        _dir: tempfile::TempDir,
    },
    External,
}

/// A live endpoint; stops what it started when dropped.
pub struct LlmEndpoint {
    socket: PathBuf,
    description: String,
    inner: Inner,
}

impl Drop for LlmEndpoint {
    fn drop(&mut self) {
        if let Inner::Forwarder { task, .. } = &self.inner {
            task.abort();
        }
    }
}

fn open_socket(path: &Path) -> Result<(), EndpointError> {
    // Agents may run as another user (the container's); the socket is their only way out and
    // carries nothing but chat completions.
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666)).map_err(|source| {
        EndpointError::Io {
            path: path.to_owned(),
            source,
        }
    })?;
    if let Some(dir) = path.parent() {
        let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711));
    }
    Ok(())
}

impl LlmEndpoint {
    /// Starts the endpoint; must be called inside a tokio runtime (the forwarder runs on it).
    pub async fn start(
        workspace: &Workspace,
        choice: &LlmChoice,
    ) -> Result<LlmEndpoint, EndpointError> {
        match choice {
            LlmChoice::Scripted => {
                let endpoint = Endpoint::start(workspace, &Llm::Scripted)
                    .map_err(|e| EndpointError::Scripted(e.to_string()))?;
                let socket = PathBuf::from(endpoint.url().trim_start_matches("unix:"));
                open_socket(&socket)?;
                Ok(LlmEndpoint {
                    description: format!("scripted server on {}", socket.display()),
                    socket,
                    inner: Inner::Scripted(endpoint),
                })
            }
            LlmChoice::Url(url) => match url.strip_prefix("unix:") {
                Some(path) => {
                    let socket = PathBuf::from(path);
                    if !std::fs::metadata(&socket)
                        .is_ok_and(|m| std::os::unix::fs::FileTypeExt::is_socket(&m.file_type()))
                    {
                        return Err(EndpointError::Url {
                            url: url.clone(),
                            reason: "no Unix socket at that path".into(),
                        });
                    }
                    Ok(LlmEndpoint {
                        description: format!("external endpoint {url}"),
                        socket,
                        inner: Inner::External,
                    })
                }
                None => {
                    let authority = url.trim_start_matches("http://").to_owned();
                    let dir = tempfile::Builder::new()
                        .prefix("pf-fwd-")
                        .tempdir()
                        .map_err(|source| EndpointError::Io {
                            path: std::env::temp_dir(),
                            source,
                        })?;
                    let socket = dir.path().join("llm.sock");
                    let listener = tokio::net::UnixListener::bind(&socket).map_err(|source| {
                        EndpointError::Io {
                            path: socket.clone(),
                            source,
                        }
                    })?;
                    open_socket(&socket)?;
                    let target = authority.clone();
                    let task = tokio::spawn(async move {
                        loop {
                            let Ok((mut inbound, _)) = listener.accept().await else {
                                continue;
                            };
                            let target = target.clone();
                            tokio::spawn(async move {
                                match tokio::net::TcpStream::connect(&target).await {
                                    Ok(mut outbound) => {
                                        let _ = tokio::io::copy_bidirectional(
                                            &mut inbound,
                                            &mut outbound,
                                        )
                                        .await;
                                    }
                                    Err(e) => {
                                        tracing::warn!("llm forwarder: cannot reach {target}: {e}")
                                    }
                                }
                            });
                        }
                    });
                    Ok(LlmEndpoint {
                        description: format!(
                            "{url} through a forwarding socket {}",
                            socket.display()
                        ),
                        socket,
                        inner: Inner::Forwarder { task, _dir: dir },
                    })
                }
            },
        }
    }

    /// The host socket episodes mount.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    pub fn describe(&self) -> &str {
        &self.description
    }

    pub fn is_scripted(&self) -> bool {
        matches!(self.inner, Inner::Scripted(_))
    }

    pub fn is_external(&self) -> bool {
        matches!(self.inner, Inner::External)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_choices() {
        assert_eq!(LlmChoice::parse("scripted").unwrap(), LlmChoice::Scripted);
        assert_eq!(
            LlmChoice::parse("http://127.0.0.1:8080/").unwrap(),
            LlmChoice::Url("http://127.0.0.1:8080".into())
        );
        assert!(LlmChoice::parse("unix:/run/x.sock").is_ok());
        for bad in [
            "unix:rel.sock",
            "https://x:1",
            "http://x",
            "http://x:1/v1",
            "gpt",
        ] {
            let e = LlmChoice::parse(bad).unwrap_err().to_string();
            assert!(e.starts_with(&format!("--llm {bad:?}")), "{e}");
        }
    }

    #[tokio::test]
    async fn forwarder_reaches_a_tcp_endpoint() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = tcp.local_addr().unwrap().port();
        tokio::spawn(async move {
            let (mut s, _) = tcp.accept().await.unwrap();
            let mut buf = [0u8; 4];
            s.read_exact(&mut buf).await.unwrap();
            s.write_all(b"pong").await.unwrap();
        });
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("CONTRACT.md"), "").unwrap();
        let ws = Workspace::open(dir.path()).unwrap();
        let ep = LlmEndpoint::start(&ws, &LlmChoice::Url(format!("http://127.0.0.1:{port}")))
            .await
            .unwrap();
        let mut c = tokio::net::UnixStream::connect(ep.socket()).await.unwrap();
        c.write_all(b"ping").await.unwrap();
        let mut buf = [0u8; 4];
        c.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"pong");
    }
}

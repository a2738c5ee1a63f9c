//! A minimal client of the Chrome DevTools Protocol over `--remote-debugging-pipe`: Chromium
//! reads commands from its file descriptor 3 and writes answers and events to 4, each message
//! a JSON object ended by a NUL byte. Enough to open a page, wait for its load, evaluate an
//! expression, record its network requests and take a screenshot.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{json, Value};

/// How long any one answer or page load may take.
const TIMEOUT: Duration = Duration::from_secs(60);

/// Milliseconds from the start of navigation to a forced layout of the loaded page.
pub const RENDERED_MS: &str =
    "(function(){document.body.getBoundingClientRect(); return performance.now();})()";

/// The `file://` URL of a page on disk.
pub fn file_url(path: &Path) -> String {
    format!("file://{}", path.canonicalize().unwrap().display())
}

/// What loading a page did.
pub struct Loaded {
    /// The URL of every request the page made (its own document included).
    pub network: Vec<String>,
    url: String,
}

impl Loaded {
    /// Requests for anything but the page itself and inline data.
    pub fn foreign_requests(&self) -> Vec<String> {
        self.network
            .iter()
            .filter(|u| **u != self.url && !u.starts_with("data:") && !u.starts_with("about:"))
            .cloned()
            .collect()
    }
}

/// A headless Chromium with one page (tab) attached.
pub struct Browser {
    child: Child,
    to_browser: File,
    from_browser: Receiver<Value>,
    /// Events read while waiting for an answer, not yet looked at.
    pending: VecDeque<Value>,
    next_id: u64,
    session: String,
}

/// A pipe (read end, write end), both closed on exec.
fn pipe() -> (File, File) {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: `fds` has room for the two descriptors pipe2 writes.
    let rc = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
    assert_eq!(rc, 0, "pipe2: {}", std::io::Error::last_os_error());
    // SAFETY: both descriptors were just created and are owned by nothing else.
    unsafe { (File::from_raw_fd(fds[0]), File::from_raw_fd(fds[1])) }
}

/// The browser binary: `PATHFINDER_CHROMIUM`, else the first of Debian's and Google's names
/// found on PATH.
fn binary() -> String {
    if let Ok(b) = std::env::var("PATHFINDER_CHROMIUM") {
        return b;
    }
    for name in ["chromium", "chromium-browser", "google-chrome"] {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {name}")])
            .output()
            .is_ok_and(|o| o.status.success());
        if found {
            return name.into();
        }
    }
    panic!(
        "headless Chromium not found: install Debian's `chromium` (`bash .ci/setup` does) or set \
         PATHFINDER_CHROMIUM to a Chromium binary"
    );
}

impl Browser {
    /// Starts the browser with a fresh profile in `profile` and attaches to a blank page of
    /// 1280×900 CSS pixels.
    pub fn launch(profile: &Path) -> Browser {
        let (their_read, mut to_browser) = pipe();
        let (from_reader, their_write) = pipe();
        let (r, w) = (their_read.as_raw_fd(), their_write.as_raw_fd());
        let mut cmd = Command::new(binary());
        cmd.args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--remote-debugging-pipe",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-extensions",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--mute-audio",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg("about:blank")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
        // SAFETY: only async-signal-safe calls (fcntl, dup2) between fork and exec. Both ends
        // are first copied above 10, so that placing one at 3 cannot overwrite the other.
        unsafe {
            cmd.pre_exec(move || {
                let r = libc::fcntl(r, libc::F_DUPFD_CLOEXEC, 10);
                let w = libc::fcntl(w, libc::F_DUPFD_CLOEXEC, 10);
                if r < 0 || w < 0 || libc::dup2(r, 3) < 0 || libc::dup2(w, 4) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", binary()));
        drop((their_read, their_write));
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut reader = BufReader::new(from_reader);
            loop {
                let mut buf = Vec::new();
                match reader.read_until(0, &mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        if buf.last() == Some(&0) {
                            buf.pop();
                        }
                        match serde_json::from_slice::<Value>(&buf) {
                            Ok(v) => {
                                if tx.send(v).is_err() {
                                    break;
                                }
                            }
                            Err(e) => panic!("a DevTools message that is not JSON: {e}"),
                        }
                    }
                }
            }
        });
        to_browser.flush().unwrap();
        let mut b = Browser {
            child,
            to_browser,
            from_browser: rx,
            pending: VecDeque::new(),
            next_id: 0,
            session: String::new(),
        };
        let target = b.call(None, "Target.createTarget", json!({"url": "about:blank"}));
        let target_id = target["targetId"].as_str().unwrap().to_owned();
        let attached = b.call(
            None,
            "Target.attachToTarget",
            json!({"targetId": target_id, "flatten": true}),
        );
        b.session = attached["sessionId"].as_str().unwrap().to_owned();
        for method in ["Page.enable", "Network.enable", "Runtime.enable"] {
            b.session_call(method, json!({}));
        }
        b.session_call(
            "Emulation.setDeviceMetricsOverride",
            json!({"width": 1280, "height": 900, "deviceScaleFactor": 1, "mobile": false}),
        );
        b
    }

    fn next(&mut self, deadline: Instant) -> Value {
        let left = deadline.saturating_duration_since(Instant::now());
        match self.from_browser.recv_timeout(left) {
            Ok(v) => v,
            Err(e) => panic!("no DevTools message from Chromium within {TIMEOUT:?}: {e}"),
        }
    }

    /// Sends a command (to the browser, or to a session) and waits for its answer, keeping the
    /// events that arrive meanwhile.
    fn call(&mut self, session: Option<&str>, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let mut msg = json!({"id": id, "method": method, "params": params});
        if let Some(s) = session {
            msg["sessionId"] = json!(s);
        }
        let mut bytes = serde_json::to_vec(&msg).unwrap();
        bytes.push(0);
        self.to_browser.write_all(&bytes).unwrap();
        self.to_browser.flush().unwrap();
        let deadline = Instant::now() + TIMEOUT;
        loop {
            let v = self.next(deadline);
            if v["id"] == json!(id) {
                if let Some(err) = v.get("error") {
                    panic!("{method}: {err}");
                }
                return v["result"].clone();
            }
            self.pending.push_back(v);
        }
    }

    fn session_call(&mut self, method: &str, params: Value) -> Value {
        let s = self.session.clone();
        self.call(Some(&s), method, params)
    }

    /// Navigates to `url` and waits for the page's load event; returns every request the page
    /// made until then.
    pub fn open(&mut self, url: &str) -> Loaded {
        self.pending.clear();
        let nav = self.session_call("Page.navigate", json!({"url": url}));
        assert!(nav.get("errorText").is_none(), "navigating to {url}: {nav}");
        let deadline = Instant::now() + TIMEOUT;
        let mut network = Vec::new();
        loop {
            let v = match self.pending.pop_front() {
                Some(v) => v,
                None => self.next(deadline),
            };
            match v["method"].as_str() {
                Some("Network.requestWillBeSent") => {
                    network.push(v["params"]["request"]["url"].as_str().unwrap_or("").into())
                }
                Some("Network.webSocketCreated") => {
                    network.push(v["params"]["url"].as_str().unwrap_or("").into())
                }
                Some("Page.loadEventFired") => break,
                _ => {}
            }
        }
        // Requests a script might start right after the load event.
        std::thread::sleep(Duration::from_millis(300));
        while let Ok(v) = self.from_browser.try_recv() {
            if v["method"] == json!("Network.requestWillBeSent") {
                network.push(v["params"]["request"]["url"].as_str().unwrap_or("").into());
            }
        }
        Loaded {
            network,
            url: url.to_owned(),
        }
    }

    /// The value of a JavaScript expression evaluated in the page (a promise's, once settled).
    pub fn eval(&mut self, expression: &str) -> Value {
        let r = self.session_call(
            "Runtime.evaluate",
            json!({"expression": expression, "returnByValue": true, "awaitPromise": true}),
        );
        if let Some(e) = r.get("exceptionDetails") {
            panic!("{expression}: {e}");
        }
        r["result"]["value"].clone()
    }

    /// A PNG of the page's viewport, written to `path`.
    pub fn screenshot(&mut self, path: &Path) {
        let r = self.session_call("Page.captureScreenshot", json!({"format": "png"}));
        let png = base64::engine::general_purpose::STANDARD
            .decode(r["data"].as_str().unwrap())
            .unwrap();
        std::fs::write(path, png).unwrap();
    }

    /// Closes the browser and waits for it to exit.
    pub fn close(mut self) {
        self.next_id += 1;
        let mut bytes =
            serde_json::to_vec(&json!({"id": self.next_id, "method": "Browser.close"})).unwrap();
        bytes.push(0);
        let _ = self.to_browser.write_all(&bytes);
        let _ = self.to_browser.flush();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

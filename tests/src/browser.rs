//! Headless Chromium (Debian's `chromium`) driven over the DevTools protocol through its pipe
//! transport (`--remote-debugging-pipe`: JSON messages ending in NUL on file descriptors 3 and
//! 4), so no WebSocket client is needed. The browser runs in a process group of its own, with a
//! profile in a temporary directory; dropping the [`Browser`] closes the pipe (Chromium exits)
//! and ends that group if it has not.

use anyhow::{Context, Result, bail};
use base64::Engine as _;
use serde_json::{Value, json};
use std::{
    fs::File,
    io::{BufRead, BufReader, Write},
    os::{fd::FromRawFd, unix::process::CommandExt},
    path::Path,
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

/// A running headless Chromium with one page (tab) attached.
pub struct Browser {
    child: Child,
    commands: File,
    replies: mpsc::Receiver<Value>,
    next_id: u64,
    session: String,
    _profile: tempfile::TempDir,
}

/// How long one DevTools command may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(60);

fn pipe() -> Result<(File, File)> {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors pipe2 writes.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        bail!("pipe2: {}", std::io::Error::last_os_error());
    }
    // SAFETY: both descriptors were just created and are owned by nobody else.
    Ok(unsafe { (File::from_raw_fd(fds[0]), File::from_raw_fd(fds[1])) })
}

impl Browser {
    /// Starts Chromium with a `width`x`height` window and opens a blank page.
    pub fn start(width: u32, height: u32) -> Result<Browser> {
        use std::os::fd::AsRawFd as _;
        let profile = tempfile::Builder::new().prefix("gp-chromium").tempdir()?;
        let (their_commands, commands) = pipe()?;
        let (replies_read, their_replies) = pipe()?;
        let (read_fd, write_fd) = (their_commands.as_raw_fd(), their_replies.as_raw_fd());
        let mut command = Command::new("chromium");
        command
            .args([
                "--headless",
                // Tests run as root, where Chromium's sandbox refuses to start.
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--no-default-browser-check",
                "--disable-extensions",
                "--disable-background-networking",
                "--disable-component-update",
                "--remote-debugging-pipe",
                &format!("--window-size={width},{height}"),
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg("about:blank")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0);
        // SAFETY: only async-signal-safe calls (dup2) between fork and exec.
        unsafe {
            command.pre_exec(move || {
                // Copies above 4 first, so neither end is overwritten by the other's dup2.
                let (high_read, high_write) =
                    (libc::fcntl(read_fd, libc::F_DUPFD, 10), libc::fcntl(write_fd, libc::F_DUPFD, 10));
                if high_read < 0 || high_write < 0 || libc::dup2(high_read, 3) < 0 || libc::dup2(high_write, 4) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = command.spawn().context("starting chromium (apt-get install -y chromium)")?;
        drop((their_commands, their_replies));
        let (sender, replies) = mpsc::channel();
        std::thread::spawn(move || {
            let mut reader = BufReader::new(replies_read);
            loop {
                let mut message = Vec::new();
                match reader.read_until(0, &mut message) {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {
                        message.pop();
                        let Ok(value) = serde_json::from_slice::<Value>(&message) else { continue };
                        if sender.send(value).is_err() {
                            return;
                        }
                    }
                }
            }
        });
        let mut browser = Browser { child, commands, replies, next_id: 0, session: String::new(), _profile: profile };
        let target = browser.browser_call("Target.createTarget", json!({"url": "about:blank"}))?;
        let target_id = target["targetId"].as_str().context("createTarget answers a targetId")?.to_owned();
        let attached =
            browser.browser_call("Target.attachToTarget", json!({"targetId": target_id, "flatten": true}))?;
        browser.session = attached["sessionId"].as_str().context("attachToTarget answers a sessionId")?.to_owned();
        browser.call("Page.enable", json!({}))?;
        browser.call("Runtime.enable", json!({}))?;
        browser.call("Network.enable", json!({}))?;
        Ok(browser)
    }

    fn send(&mut self, method: &str, params: Value, session: Option<String>) -> Result<Value> {
        self.next_id += 1;
        let id = self.next_id;
        let mut message = json!({"id": id, "method": method, "params": params});
        if let Some(session) = session {
            message["sessionId"] = Value::String(session);
        }
        let mut bytes = serde_json::to_vec(&message)?;
        bytes.push(0);
        self.commands.write_all(&bytes).context("writing to chromium's pipe")?;
        let deadline = Instant::now() + CALL_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let reply = self.replies.recv_timeout(left).with_context(|| format!("no answer to {method}"))?;
            if reply["id"] != id {
                continue;
            }
            if let Some(error) = reply.get("error") {
                bail!("{method}: {error}");
            }
            return Ok(reply["result"].clone());
        }
    }

    fn browser_call(&mut self, method: &str, params: Value) -> Result<Value> {
        self.send(method, params, None)
    }

    /// A DevTools command to the page.
    pub fn call(&mut self, method: &str, params: Value) -> Result<Value> {
        let session = self.session.clone();
        self.send(method, params, Some(session))
    }

    /// Loads `url` and waits until its document is complete.
    pub fn navigate(&mut self, url: &str) -> Result<()> {
        let answer = self.call("Page.navigate", json!({"url": url}))?;
        if let Some(error) = answer.get("errorText").and_then(Value::as_str) {
            bail!("navigating to {url}: {error}");
        }
        self.wait_until(Duration::from_secs(30), "document.readyState === 'complete'")
            .with_context(|| format!("{url} did not finish loading"))?;
        Ok(())
    }

    /// The value of a JavaScript expression (promises awaited).
    pub fn eval(&mut self, expression: &str) -> Result<Value> {
        let answer = self
            .call("Runtime.evaluate", json!({"expression": expression, "returnByValue": true, "awaitPromise": true}))?;
        if let Some(exception) = answer.get("exceptionDetails") {
            bail!("{expression}: {exception}");
        }
        Ok(answer["result"]["value"].clone())
    }

    /// Polls an expression in the page until it is truthy: how a test sees the page change
    /// without reloading it.
    pub fn wait_until(&mut self, timeout: Duration, expression: &str) -> Result<Value> {
        let deadline = Instant::now() + timeout;
        loop {
            let value = self.eval(expression)?;
            let truthy = match &value {
                Value::Null => false,
                Value::Bool(b) => *b,
                Value::String(s) => !s.is_empty(),
                Value::Number(n) => n.as_f64() != Some(0.0),
                _ => true,
            };
            if truthy {
                return Ok(value);
            }
            if Instant::now() > deadline {
                bail!("{expression} stayed false for {} s", timeout.as_secs());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Saves a PNG of the page to `path`.
    pub fn screenshot(&mut self, path: &Path) -> Result<()> {
        let shot = self.call("Page.captureScreenshot", json!({"format": "png", "captureBeyondViewport": false}))?;
        let data = shot["data"].as_str().context("a screenshot")?;
        let png = base64::engine::general_purpose::STANDARD.decode(data)?;
        std::fs::write(path, png).with_context(|| format!("writing {}", path.display()))
    }

    /// Presses a key (`Tab`) as a keyboard would.
    pub fn press(&mut self, key: &str, code: u32) -> Result<()> {
        for kind in ["keyDown", "keyUp"] {
            self.call(
                "Input.dispatchKeyEvent",
                json!({"type": kind, "key": key, "code": key, "windowsVirtualKeyCode": code, "nativeVirtualKeyCode": code}),
            )?;
        }
        Ok(())
    }

    /// Enter on the focused element, as a keyboard user follows a link (the key event carries
    /// its text, as a real key press does, so the element is activated).
    pub fn enter(&mut self) -> Result<()> {
        for (kind, text) in [("keyDown", "\r"), ("keyUp", "")] {
            self.call(
                "Input.dispatchKeyEvent",
                json!({"type": kind, "key": "Enter", "code": "Enter", "text": text,
                       "windowsVirtualKeyCode": 13, "nativeVirtualKeyCode": 13}),
            )?;
        }
        Ok(())
    }

    /// Presses Tab (at most `presses` times) until the focused element's text or accessible
    /// label is `name`: the element is reachable from the keyboard, in document order.
    pub fn tab_to(&mut self, name: &str, presses: usize) -> Result<()> {
        let mut reached = Vec::new();
        for _ in 0..presses {
            self.press("Tab", 9)?;
            let focused = self.eval(
                "(() => { const e = document.activeElement; \
                 return e ? (e.getAttribute('aria-label') || e.textContent.trim()) : ''; })()",
            )?;
            let focused = focused.as_str().unwrap_or("").to_owned();
            if focused == name {
                return Ok(());
            }
            reached.push(focused);
        }
        bail!("Tab never reached {name:?}; it reached {reached:?}")
    }

    /// The accessibility tree's nodes as (role, name), ignored nodes left out.
    pub fn accessibility(&mut self) -> Result<Vec<(String, String)>> {
        let tree = self.call("Accessibility.getFullAXTree", json!({}))?;
        Ok(tree["nodes"]
            .as_array()
            .context("AX nodes")?
            .iter()
            .filter(|n| n["ignored"] != true)
            .map(|n| {
                let text = |field: &str| n[field]["value"].as_str().unwrap_or("").to_owned();
                (text("role"), text("name"))
            })
            .collect())
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.browser_call("Browser.close", json!({}));
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        // The group is Chromium's own (process_group(0)): its helpers go with it.
        // SAFETY: kill has no memory preconditions; the group id is our child's pid.
        unsafe { libc::kill(-(self.child.id() as i32), libc::SIGKILL) };
        let _ = self.child.wait();
    }
}

//! A private headless Chromium driven over WebDriver: `chromedriver` on a free loopback port
//! (Debian's `chromium-driver`), and a [`Session`] that speaks the W3C WebDriver protocol to it
//! in plain HTTP/1.1 (a handful of JSON requests: no client crate needed).
//!
//! Without `chromedriver` and `chromium` a test prints why and skips, unless
//! `JOBGUARD_REQUIRE_CHROMIUM=1` (as `.ci/run` sets), where it panics instead.

use crate::process::{free_port, on_path};
use serde_json::{Value, json};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Set to `1` to make a missing Chromium a failure rather than a skip.
pub const REQUIRE_ENV: &str = "JOBGUARD_REQUIRE_CHROMIUM";

/// The W3C name of an element reference in a JSON answer.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// A `chromedriver` this test started, killed on drop.
pub struct Chromedriver {
    port: u16,
    browser: PathBuf,
    child: Child,
}

impl Chromedriver {
    /// Starts `chromedriver` on a free loopback port and waits until it is ready, or returns
    /// `None` (after printing why) when it or the browser is not installed.
    ///
    /// # Panics
    ///
    /// When either is missing and `JOBGUARD_REQUIRE_CHROMIUM=1`, or when the driver does not
    /// come up within 20 s.
    pub fn start() -> Option<Chromedriver> {
        let driver = on_path("chromedriver");
        let browser = on_path("chromium").or_else(|| on_path("chromium-browser"));
        let (Some(driver), Some(browser)) = (driver, browser) else {
            let why = "chromedriver or chromium not found (Debian: apt-get install chromium chromium-driver)";
            if std::env::var(REQUIRE_ENV).as_deref() == Ok("1") {
                panic!("{why}, and {REQUIRE_ENV}=1");
            }
            eprintln!("skipping: {why}");
            return None;
        };
        let port = free_port(9515);
        let child = Command::new(driver)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromedriver");
        let mut driver = Chromedriver {
            port,
            browser,
            child,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok((_, status)) = driver.request("GET", "/status", None)
                && status["value"]["ready"] == true
            {
                return Some(driver);
            }
            if let Ok(Some(exit)) = driver.child.try_wait() {
                panic!("chromedriver exited: {exit}");
            }
            assert!(
                Instant::now() < deadline,
                "chromedriver not ready within 20 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// A new headless browser session, `width` × `height`.
    pub fn session(&self, width: u32, height: u32) -> Session<'_> {
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": self.browser,
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                         "--disable-dev-shm-usage", format!("--window-size={width},{height}")],
            },
        }}});
        let (status, answer) = self
            .request("POST", "/session", Some(&caps))
            .expect("chromedriver answers");
        assert_eq!(status, 200, "new session: {answer}");
        let id = answer["value"]["sessionId"]
            .as_str()
            .expect("a session id")
            .to_owned();
        let session = Session { driver: self, id };
        // Finding an element waits up to 5 s for it to appear (a page still loading).
        session.call("POST", "/timeouts", Some(json!({"implicit": 5000})));
        session
    }

    /// One request to the driver: its status and JSON body.
    fn request(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> std::io::Result<(u16, Value)> {
        let body = body.map(Value::to_string).unwrap_or_default();
        let mut stream = TcpStream::connect(("127.0.0.1", self.port))?;
        stream.set_read_timeout(Some(Duration::from_secs(60)))?;
        write!(
            stream,
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            self.port,
            body.len()
        )?;
        // chromedriver keeps the connection open: read the head, then the body by its length.
        let mut raw = Vec::new();
        let mut buf = [0u8; 16 * 1024];
        let head_end = loop {
            if let Some(at) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
                break at + 4;
            }
            let n = stream.read(&mut buf)?;
            if n == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            raw.extend_from_slice(&buf[..n]);
        };
        let head = String::from_utf8_lossy(&raw[..head_end]).to_ascii_lowercase();
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let length = head.lines().find_map(|line| {
            let value = line.strip_prefix("content-length:")?;
            value.trim().parse::<usize>().ok()
        });
        let body = match length {
            Some(length) => {
                while raw.len() < head_end + length {
                    let n = stream.read(&mut buf)?;
                    if n == 0 {
                        return Err(std::io::ErrorKind::UnexpectedEof.into());
                    }
                    raw.extend_from_slice(&buf[..n]);
                }
                String::from_utf8_lossy(&raw[head_end..head_end + length]).into_owned()
            }
            None => {
                stream.read_to_end(&mut raw)?;
                let rest = String::from_utf8_lossy(&raw[head_end..]).into_owned();
                if head.contains("transfer-encoding: chunked") {
                    unchunk(&rest)
                } else {
                    rest
                }
            }
        };
        Ok((status, serde_json::from_str(&body).unwrap_or(Value::Null)))
    }
}

/// A chunked body, whole.
fn unchunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let Ok(size) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if size == 0 || rest.len() < size {
            break;
        }
        out.push_str(&rest[..size]);
        body = rest[size..].trim_start_matches("\r\n");
    }
    out
}

impl Drop for Chromedriver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One browser session, closed on drop.
pub struct Session<'d> {
    driver: &'d Chromedriver,
    id: String,
}

/// An element of the current page.
#[derive(Debug, Clone)]
pub struct Element(String);

impl Session<'_> {
    fn call(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let path = format!("/session/{}{path}", self.id);
        let (status, answer) = self
            .driver
            .request(method, &path, body.as_ref())
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
        assert_eq!(status, 200, "{method} {path}: {answer}");
        answer["value"].clone()
    }

    /// Opens `url` and waits for the page to load.
    pub fn goto(&self, url: &str) {
        self.call("POST", "/url", Some(json!({"url": url})));
    }

    /// The current page's URL.
    pub fn url(&self) -> String {
        self.call("GET", "/url", None)
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    /// The element that `css` selects.
    ///
    /// # Panics
    ///
    /// When there is none.
    pub fn find(&self, css: &str) -> Element {
        let path = format!("/session/{}/element", self.id);
        let (status, answer) = self
            .driver
            .request(
                "POST",
                &path,
                Some(&json!({"using": "css selector", "value": css})),
            )
            .expect("chromedriver answers");
        assert_eq!(
            status,
            200,
            "no element `{css}` on {}: {answer}",
            self.url()
        );
        Element(
            answer["value"][ELEMENT]
                .as_str()
                .expect("an element")
                .to_owned(),
        )
    }

    /// How many elements `css` selects.
    pub fn count(&self, css: &str) -> usize {
        let found = self.call(
            "POST",
            "/elements",
            Some(json!({"using": "css selector", "value": css})),
        );
        found.as_array().map_or(0, Vec::len)
    }

    /// Clicks `element`, a link or a submit button that leads to another URL, and waits (up to
    /// 10 s) until the browser is at that other URL and its page has loaded: a form's
    /// submission may still be under way when the click returns.
    pub fn click(&self, element: &Element) {
        let before = self.url();
        self.call(
            "POST",
            &format!("/element/{}/click", element.0),
            Some(json!({})),
        );
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.url() == before {
            assert!(
                Instant::now() < deadline,
                "the click left the browser at {before}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        let state = json!({"script": "return document.readyState", "args": []});
        while self.call("POST", "/execute/sync", Some(state.clone())) != "complete" {
            assert!(
                Instant::now() < deadline,
                "the page at {} did not load",
                self.url()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Clears the field `element` and types `text` into it.
    pub fn type_into(&self, element: &Element, text: &str) {
        self.call(
            "POST",
            &format!("/element/{}/clear", element.0),
            Some(json!({})),
        );
        self.call(
            "POST",
            &format!("/element/{}/value", element.0),
            Some(json!({"text": text})),
        );
    }

    /// The visible text of `element`.
    pub fn text(&self, element: &Element) -> String {
        self.call("GET", &format!("/element/{}/text", element.0), None)
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    /// The visible text of the element `css` selects.
    pub fn text_of(&self, css: &str) -> String {
        self.text(&self.find(css))
    }

    /// A PNG of the viewport.
    pub fn screenshot(&self) -> Vec<u8> {
        use base64::Engine;
        let encoded = self.call("GET", "/screenshot", None);
        base64::engine::general_purpose::STANDARD
            .decode(encoded.as_str().expect("base64"))
            .expect("a base64 PNG")
    }
}

impl Drop for Session<'_> {
    fn drop(&mut self) {
        let _ = self
            .driver
            .request("DELETE", &format!("/session/{}", self.id), None);
    }
}

//! The bounds of one chat-template rendering: instructions (minijinja's
//! fuel), output bytes and wall time. A template is code: the checkpoint's,
//! `--chat-template`'s, or a benign one driven by request data
//! (`chat_template_kwargs`, a loop over the messages) can loop 10¹⁰ times or
//! write gigabytes, and it runs on the preparation pool, whose jobs every
//! request shares. Each bound ends the rendering with
//! [`TextError::TemplateOverLimit`] naming it (a 400 on the server).
//!
//! How each is enforced:
//! - **fuel**: minijinja counts one unit per VM instruction and stops at
//!   the budget. This bounds loops and recursion whatever they write, so it
//!   is what bounds the time of a rendering that writes nothing.
//! - **output**: the rendering streams into [`CappedWriter`], which fails the
//!   first write past the cap, so the text never grows beyond it.
//! - **time**: checked at every write, ending a template that writes slowly
//!   (large values built between writes) before its fuel is spent.
//!
//! - **memory**: none of the above bounds a value built and never written,
//!   e.g. a string doubled by `ns.s = ns.s ~ ns.s` in a loop with no output
//!   (each doubling is one instruction, and minijinja 2 offers no hook
//!   between instructions nor a size limit on `~`/`+`). The server renders
//!   in worker processes whose address space is capped (`render_worker`):
//!   such a template kills its worker, not the server.

use std::io;
use std::time::{Duration, Instant};

/// Instructions one rendering may execute. A maximal request through the
/// costliest official template (gpt-oss's: 2048 messages and 128 tools,
/// whose schemas it writes with macros) renders within an eighth of it
/// (tests/text_chat.rs checks that), in ~45 ms; the whole budget is spent in
/// about 0.7 s on one core of the 2-core test machine (~14 M instructions/s).
pub const DEFAULT_FUEL: u64 = 10_000_000;
/// Text one rendering may write when nothing smaller is set (the server
/// sets its `max_prompt_bytes`: a longer prompt is refused anyway).
pub const DEFAULT_MAX_OUTPUT_BYTES: usize = 64 << 20;
/// Wall time of one rendering.
pub const DEFAULT_MAX_TIME: Duration = Duration::from_secs(5);

/// The limit a rendering ran into.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TemplateLimit {
    /// `max_template_fuel`: instructions.
    Fuel(u64),
    /// `max_template_output_bytes`.
    OutputBytes(usize),
    /// `max_template_seconds`.
    Time(Duration),
    /// `max_template_memory_bytes`: the address space of the worker process
    /// the template renders in (`render_worker`).
    MemoryBytes(u64),
}

impl TemplateLimit {
    /// The limit's name (the server's error `code`).
    pub fn name(&self) -> &'static str {
        match self {
            TemplateLimit::Fuel(_) => "max_template_fuel",
            TemplateLimit::OutputBytes(_) => "max_template_output_bytes",
            TemplateLimit::Time(_) => "max_template_seconds",
            TemplateLimit::MemoryBytes(_) => "max_template_memory_bytes",
        }
    }
}

impl std::fmt::Display for TemplateLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TemplateLimit::Fuel(n) => write!(
                f,
                "the chat template ran more than {} = {n} instructions",
                self.name()
            ),
            TemplateLimit::OutputBytes(n) => write!(
                f,
                "the chat template wrote more than {} = {n} bytes",
                self.name()
            ),
            TemplateLimit::Time(t) => write!(
                f,
                "the chat template ran longer than {} = {}",
                self.name(),
                t.as_secs_f64()
            ),
            TemplateLimit::MemoryBytes(n) => write!(
                f,
                "the chat template built values larger than {} = {n} bytes",
                self.name()
            ),
        }
    }
}

/// The bounds of one rendering.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RenderLimits {
    pub fuel: u64,
    pub max_output_bytes: usize,
    pub max_time: Duration,
}

impl Default for RenderLimits {
    fn default() -> Self {
        RenderLimits {
            fuel: DEFAULT_FUEL,
            max_output_bytes: DEFAULT_MAX_OUTPUT_BYTES,
            max_time: DEFAULT_MAX_TIME,
        }
    }
}

/// The rendering's output: fails the write that would pass the cap or
/// that comes after the deadline, and remembers which limit it was.
pub(crate) struct CappedWriter {
    pub text: Vec<u8>,
    max_bytes: usize,
    max_time: Duration,
    started: Instant,
    pub over: Option<TemplateLimit>,
}

impl CappedWriter {
    pub fn new(limits: &RenderLimits) -> CappedWriter {
        CappedWriter {
            text: Vec::new(),
            max_bytes: limits.max_output_bytes,
            max_time: limits.max_time,
            started: Instant::now(),
            over: None,
        }
    }
}

impl io::Write for CappedWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let over = if self.text.len().saturating_add(buf.len()) > self.max_bytes {
            Some(TemplateLimit::OutputBytes(self.max_bytes))
        } else if self.started.elapsed() > self.max_time {
            Some(TemplateLimit::Time(self.max_time))
        } else {
            None
        };
        if let Some(limit) = over {
            self.over = Some(limit);
            return Err(io::Error::other(limit.to_string()));
        }
        self.text.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn the_writer_stops_at_the_cap_and_at_the_deadline() {
        let limits = RenderLimits {
            max_output_bytes: 5,
            ..RenderLimits::default()
        };
        let mut w = CappedWriter::new(&limits);
        w.write_all(b"12345").unwrap();
        assert!(w.write_all(b"6").is_err());
        assert_eq!(w.over, Some(TemplateLimit::OutputBytes(5)));
        assert_eq!(w.text, b"12345");

        let limits = RenderLimits {
            max_time: Duration::ZERO,
            ..RenderLimits::default()
        };
        let mut w = CappedWriter::new(&limits);
        std::thread::sleep(Duration::from_millis(2));
        assert!(w.write_all(b"x").is_err());
        assert_eq!(w.over, Some(TemplateLimit::Time(Duration::ZERO)));
    }
}

//! The worker's side of `render_worker`: `sparkrt render-worker BYTES`
//! renders the parent's chat template in a process capped at BYTES of
//! address space (the protocol is described there).

use std::io::{self, BufRead, BufWriter};

use super::chat::ChatTemplate;
use super::config_files::SpecialTokens;
use super::error::TextError;
use super::render_limits::TemplateLimit;
use super::render_worker::{
    Init, MAX_MESSAGE_BYTES, OwnedRequest, READY, Reply, WireLimit, micros, write_line,
};

/// The worker's side (`sparkrt render-worker BYTES`): caps its own address
/// space at BYTES, reads the template, says it is ready, then renders each
/// request from stdin onto stdout until stdin closes.
pub fn serve_stdio(memory_bytes: u64) -> io::Result<()> {
    cap_address_space(memory_bytes)?;
    let stdin = io::stdin();
    let mut input = stdin.lock();
    let mut stdout = BufWriter::new(io::stdout().lock());
    let mut line = String::new();
    input.read_line(&mut line)?;
    let init: Init = serde_json::from_str(&line).map_err(io::Error::other)?;
    // The parent compiled the same source already; an error here is its bug.
    let mut template = ChatTemplate::from_source(init.source, SpecialTokens::default())
        .map_err(|e| io::Error::other(e.to_string()))?;
    write_line(&mut stdout, READY.as_bytes())?;
    loop {
        line.clear();
        if input.read_line(&mut line)? == 0 {
            return Ok(());
        }
        let request: OwnedRequest = serde_json::from_str(&line).map_err(io::Error::other)?;
        template.set_limits(request.limits.into());
        let reply = match template.render_here(&request.context) {
            Ok(text) => Reply::Text(text),
            Err(TextError::TemplateOverLimit { limit }) => match limit {
                TemplateLimit::Fuel(n) => Reply::Over(WireLimit::Fuel(n)),
                TemplateLimit::OutputBytes(n) => Reply::Over(WireLimit::OutputBytes(n)),
                TemplateLimit::Time(t) => Reply::Over(WireLimit::TimeUs(micros(t))),
                // Only the parent sees a worker run out of memory.
                other @ TemplateLimit::MemoryBytes(_) => Reply::Failed(cut(other.to_string())),
            },
            Err(other) => Reply::Failed(cut(other.to_string())),
        };
        let reply = serde_json::to_vec(&reply).map_err(io::Error::other)?;
        write_line(&mut stdout, &reply)?;
    }
}

/// An error message cut to [`MAX_MESSAGE_BYTES`] at a character boundary.
fn cut(mut message: String) -> String {
    if message.len() > MAX_MESSAGE_BYTES {
        let mut end = MAX_MESSAGE_BYTES;
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        message.truncate(end);
        message.push_str(" …");
    }
    message
}

/// Caps this process's address space (`RLIMIT_AS`).
#[cfg(unix)]
fn cap_address_space(bytes: u64) -> io::Result<()> {
    let limit = libc::rlimit {
        rlim_cur: bytes as libc::rlim_t,
        rlim_max: bytes as libc::rlim_t,
    };
    // SAFETY: setrlimit only reads the struct it is given.
    if unsafe { libc::setrlimit(libc::RLIMIT_AS, &limit) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(not(unix))]
fn cap_address_space(_bytes: u64) -> io::Result<()> {
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_messages_are_cut_at_a_character_boundary() {
        let message = "é".repeat(MAX_MESSAGE_BYTES);
        let cut = cut(message);
        assert!(cut.len() <= MAX_MESSAGE_BYTES + " …".len());
        assert!(cut.ends_with(" …"));
        assert_eq!(super::cut("short".into()), "short");
    }
}

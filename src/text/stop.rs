//! Stop strings over streamed text.
//!
//! A stop string can arrive split over several chunks ("<|e" then "nd|>"), so
//! the matcher holds back the end of the text while it could still be the
//! start of a stop string, and releases it once it cannot. Text before a stop
//! string is emitted; the stop string and anything after it are not (the
//! OpenAI API's behaviour), unless the stop string is asked for too (vLLM's
//! `include_stop_str_in_output`: then it is emitted, and nothing after it). Generation ends at the first stop string to
//! complete, as it would if the text arrived one character at a time.

/// What the caller may do after a chunk of text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StopStep {
    /// No stop string yet: `emit` is safe to send; more may be held back.
    Continue { emit: String },
    /// A stop string completed: send `emit` (the text before it) and end the
    /// sequence. `stop_index` is the stop string's index in the list given to
    /// [`StopMatcher::new`].
    Stopped { emit: String, stop_index: usize },
}

/// Finds stop strings in a stream of text chunks.
#[derive(Clone, Debug)]
pub struct StopMatcher {
    /// Non-empty stop strings with their index in the caller's list.
    stops: Vec<(usize, String)>,
    /// Whether the stop string itself is emitted (vLLM's
    /// `include_stop_str_in_output`).
    include_stop: bool,
    /// Stop strings from this index on are always emitted (the server's
    /// own: the end of the one tool call `parallel_tool_calls: false`
    /// allows).
    kept_from: usize,
    /// Text received but not yet emitted: always a possible start of a stop
    /// string, except transiently inside `push`.
    held: String,
}

impl StopMatcher {
    /// Empty stop strings are ignored (they would match everywhere).
    pub fn new<S: Into<String>>(stops: impl IntoIterator<Item = S>) -> StopMatcher {
        StopMatcher {
            stops: stops
                .into_iter()
                .map(Into::into)
                .enumerate()
                .filter(|(_, stop)| !stop.is_empty())
                .collect(),
            include_stop: false,
            kept_from: usize::MAX,
            held: String::new(),
        }
    }

    /// Adds stop strings that end the text *after* themselves (they are
    /// emitted whatever `include_stop_str_in_output` says); their indices
    /// follow the list given to [`StopMatcher::new`].
    pub fn with_kept_stops<S: Into<String>>(
        mut self,
        first_index: usize,
        kept: impl IntoIterator<Item = S>,
    ) -> StopMatcher {
        self.kept_from = first_index;
        self.stops.extend(
            kept.into_iter()
                .map(Into::into)
                .enumerate()
                .map(|(i, stop)| (first_index + i, stop))
                .filter(|(_, stop)| !stop.is_empty()),
        );
        self
    }

    /// Emits the stop string too, not only the text before it.
    pub fn with_stop_in_output(mut self, include: bool) -> StopMatcher {
        self.include_stop = include;
        self
    }

    /// Feeds the next chunk of generated text.
    pub fn push(&mut self, text: &str) -> StopStep {
        self.held.push_str(text);
        if let Some((start, end, stop_index)) = self.earliest_stop() {
            let keep = self.include_stop || stop_index >= self.kept_from;
            let emit = self.held[..if keep { end } else { start }].to_owned();
            self.held.clear();
            return StopStep::Stopped { emit, stop_index };
        }
        let keep_from = self.start_of_possible_stop();
        let emit = self.held[..keep_from].to_owned();
        self.held.drain(..keep_from);
        StopStep::Continue { emit }
    }

    /// Ends the stream without a stop string: returns the held-back text.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }

    /// The text currently held back.
    pub fn held(&self) -> &str {
        &self.held
    }

    /// Byte range and index of the stop string that completes first in the
    /// held text: the one that ends earliest, and of those the longest (then
    /// the one listed first). Scanning a whole chunk this way gives the same
    /// answer as feeding it one character at a time, so the result does not
    /// depend on how the text was cut into chunks.
    fn earliest_stop(&self) -> Option<(usize, usize, usize)> {
        self.stops
            .iter()
            .filter_map(|&(index, ref stop)| {
                let start = self.held.find(stop.as_str())?;
                Some((start + stop.len(), start, index))
            })
            .min()
            .map(|(end, start, index)| (start, end, index))
    }

    /// Byte offset of the longest suffix of the held text that is a proper
    /// prefix of some stop string (`held.len()` when there is none). Only that
    /// suffix can still grow into a stop string; everything before it cannot,
    /// because a stop string starting earlier would need a longer such suffix.
    fn start_of_possible_stop(&self) -> usize {
        self.held
            .char_indices()
            .map(|(i, _)| i)
            .find(|&i| {
                let suffix = &self.held[i..];
                self.stops
                    .iter()
                    .any(|(_, stop)| stop.len() > suffix.len() && stop.starts_with(suffix))
            })
            .unwrap_or(self.held.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kept_stops_end_the_text_after_themselves() {
        let mut m = StopMatcher::new(["END"]).with_kept_stops(1, ["</c>"]);
        assert_eq!(m.push("a</"), StopStep::Continue { emit: "a".into() });
        assert_eq!(
            m.push("c> more"),
            StopStep::Stopped {
                emit: "</c>".into(),
                stop_index: 1
            }
        );
        let mut m = StopMatcher::new(["END"]).with_kept_stops(1, ["</c>"]);
        assert_eq!(
            m.push("xEND</c>"),
            StopStep::Stopped {
                emit: "x".into(),
                stop_index: 0
            }
        );
    }

    #[test]
    fn holds_back_only_a_possible_stop_prefix() {
        let mut m = StopMatcher::new(["END"]);
        assert_eq!(m.push("abcE"), StopStep::Continue { emit: "abc".into() });
        assert_eq!(m.held(), "E");
        // "EX" cannot become "END": all of it goes out.
        assert_eq!(m.push("X"), StopStep::Continue { emit: "EX".into() });
        assert_eq!(m.held(), "");
    }

    #[test]
    fn the_stop_string_is_emitted_when_asked_for() {
        let mut m = StopMatcher::new(["END"]).with_stop_in_output(true);
        assert_eq!(m.push("abcE"), StopStep::Continue { emit: "abc".into() });
        assert_eq!(
            m.push("NDxyz"),
            StopStep::Stopped {
                emit: "END".into(),
                stop_index: 0
            }
        );
        let mut m = StopMatcher::new(["END"]);
        assert_eq!(
            m.push("abENDx"),
            StopStep::Stopped {
                emit: "ab".into(),
                stop_index: 0
            }
        );
    }
}

//! The output parser's deltas as Responses output items and stream events.
//! A blocking answer and a stream go through the same [`OutputBuilder`], so
//! the final `output` is exactly what the events built up.
//!
//! Items follow the parser's order: a reasoning item for a run of reasoning,
//! a message item for a run of content, a function_call item per tool call.
//! Each item opens with `response.output_item.added` (and, for text,
//! `response.content_part.added`), grows by deltas, and closes with the
//! `.done` events when the next item opens or the output ends.

use super::types::{OutputItem, OutputPart, StreamEvent};
use crate::text::parsers::Delta;

/// The item being written.
enum Open {
    Reasoning {
        id: String,
        text: String,
    },
    Message {
        id: String,
        text: String,
    },
    Call {
        parser_index: usize,
        id: String,
        call_id: String,
        name: String,
        arguments: String,
    },
}

pub struct OutputBuilder {
    /// Item ids are `rs_`, `msg_`, `fc_` + this + the item's index.
    id_stem: String,
    done: Vec<OutputItem>,
    open: Option<Open>,
}

impl OutputBuilder {
    pub fn new(id_stem: impl Into<String>) -> OutputBuilder {
        OutputBuilder {
            id_stem: id_stem.into(),
            done: Vec::new(),
            open: None,
        }
    }

    /// Whether the output is inside reasoning now (to count reasoning tokens).
    pub fn in_reasoning(&self) -> bool {
        matches!(self.open, Some(Open::Reasoning { .. }))
    }

    /// The events `delta` makes, appended to `out`.
    pub fn push(&mut self, delta: Delta, out: &mut Vec<StreamEvent>) {
        match delta {
            Delta::Reasoning(text) => {
                if !self.in_reasoning() {
                    self.close("completed", out);
                    let id = self.item_id("rs");
                    out.push(self.added(OutputItem::Reasoning {
                        id: id.clone(),
                        summary: Vec::new(),
                        content: Vec::new(),
                        status: "in_progress",
                    }));
                    out.push(StreamEvent::ContentPartAdded {
                        item_id: id.clone(),
                        output_index: self.done.len(),
                        content_index: 0,
                        part: OutputPart::ReasoningText {
                            text: String::new(),
                        },
                    });
                    self.open = Some(Open::Reasoning {
                        id,
                        text: String::new(),
                    });
                }
                if let Some(Open::Reasoning { id, text: all }) = &mut self.open {
                    all.push_str(&text);
                    out.push(StreamEvent::ReasoningTextDelta {
                        item_id: id.clone(),
                        output_index: self.done.len(),
                        content_index: 0,
                        delta: text,
                    });
                }
            }
            Delta::Content(text) => {
                if !matches!(self.open, Some(Open::Message { .. })) {
                    self.close("completed", out);
                    let id = self.item_id("msg");
                    out.push(self.added(OutputItem::Message {
                        id: id.clone(),
                        role: "assistant",
                        status: "in_progress",
                        content: Vec::new(),
                    }));
                    out.push(StreamEvent::ContentPartAdded {
                        item_id: id.clone(),
                        output_index: self.done.len(),
                        content_index: 0,
                        part: output_text(String::new()),
                    });
                    self.open = Some(Open::Message {
                        id,
                        text: String::new(),
                    });
                }
                if let Some(Open::Message { id, text: all }) = &mut self.open {
                    all.push_str(&text);
                    out.push(StreamEvent::OutputTextDelta {
                        item_id: id.clone(),
                        output_index: self.done.len(),
                        content_index: 0,
                        delta: text,
                        logprobs: Vec::new(),
                    });
                }
            }
            Delta::ToolCallStart { index, id, name } => {
                self.close("completed", out);
                let item_id = self.item_id("fc");
                out.push(self.added(OutputItem::FunctionCall {
                    id: item_id.clone(),
                    call_id: id.clone(),
                    name: name.clone(),
                    arguments: String::new(),
                    status: "in_progress",
                }));
                self.open = Some(Open::Call {
                    parser_index: index,
                    id: item_id,
                    call_id: id,
                    name,
                    arguments: String::new(),
                });
            }
            Delta::ToolCallArguments { index, fragment } => {
                // The parser sends a call's arguments right after its start.
                if let Some(Open::Call {
                    parser_index,
                    id,
                    arguments,
                    ..
                }) = &mut self.open
                    && *parser_index == index
                {
                    arguments.push_str(&fragment);
                    out.push(StreamEvent::FunctionCallArgumentsDelta {
                        item_id: id.clone(),
                        output_index: self.done.len(),
                        delta: fragment,
                    });
                }
            }
        }
    }

    /// Closes the last item (`incomplete` when the output was cut) and gives
    /// the whole output.
    pub fn finish(&mut self, truncated: bool, out: &mut Vec<StreamEvent>) -> Vec<OutputItem> {
        self.close(if truncated { "incomplete" } else { "completed" }, out);
        self.done.clone()
    }

    fn item_id(&self, prefix: &str) -> String {
        format!("{prefix}_{}_{}", self.id_stem, self.done.len())
    }

    fn added(&self, item: OutputItem) -> StreamEvent {
        StreamEvent::OutputItemAdded {
            output_index: self.done.len(),
            item,
        }
    }

    /// The `.done` events of the open item, which joins the output.
    fn close(&mut self, status: &'static str, out: &mut Vec<StreamEvent>) {
        let output_index = self.done.len();
        let item = match self.open.take() {
            None => return,
            Some(Open::Reasoning { id, text }) => {
                out.push(StreamEvent::ReasoningTextDone {
                    item_id: id.clone(),
                    output_index,
                    content_index: 0,
                    text: text.clone(),
                });
                let part = OutputPart::ReasoningText { text };
                out.push(StreamEvent::ContentPartDone {
                    item_id: id.clone(),
                    output_index,
                    content_index: 0,
                    part: part.clone(),
                });
                OutputItem::Reasoning {
                    id,
                    summary: Vec::new(),
                    content: vec![part],
                    status,
                }
            }
            Some(Open::Message { id, text }) => {
                out.push(StreamEvent::OutputTextDone {
                    item_id: id.clone(),
                    output_index,
                    content_index: 0,
                    text: text.clone(),
                    logprobs: Vec::new(),
                });
                let part = output_text(text);
                out.push(StreamEvent::ContentPartDone {
                    item_id: id.clone(),
                    output_index,
                    content_index: 0,
                    part: part.clone(),
                });
                OutputItem::Message {
                    id,
                    role: "assistant",
                    status,
                    content: vec![part],
                }
            }
            Some(Open::Call {
                id,
                call_id,
                name,
                arguments,
                ..
            }) => {
                out.push(StreamEvent::FunctionCallArgumentsDone {
                    item_id: id.clone(),
                    output_index,
                    name: name.clone(),
                    arguments: arguments.clone(),
                });
                OutputItem::FunctionCall {
                    id,
                    call_id,
                    name,
                    arguments,
                    status,
                }
            }
        };
        out.push(StreamEvent::OutputItemDone {
            output_index,
            item: item.clone(),
        });
        self.done.push(item);
    }
}

fn output_text(text: String) -> OutputPart {
    OutputPart::OutputText {
        text,
        annotations: Vec::new(),
        logprobs: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(events: &[StreamEvent]) -> Vec<&'static str> {
        events.iter().map(StreamEvent::kind).collect()
    }

    #[test]
    fn reasoning_content_and_a_call_become_three_items_with_their_events() {
        let mut builder = OutputBuilder::new("7");
        let mut events = Vec::new();
        for delta in [
            Delta::Reasoning("think ".into()),
            Delta::Reasoning("more".into()),
            Delta::Content("Hi".into()),
            Delta::ToolCallStart {
                index: 0,
                id: "call_a".into(),
                name: "f".into(),
            },
            Delta::ToolCallArguments {
                index: 0,
                fragment: "{\"x\":".into(),
            },
            Delta::ToolCallArguments {
                index: 0,
                fragment: " 1}".into(),
            },
        ] {
            builder.push(delta, &mut events);
        }
        let output = builder.finish(false, &mut events);
        assert_eq!(
            kinds(&events),
            [
                "response.output_item.added",
                "response.content_part.added",
                "response.reasoning_text.delta",
                "response.reasoning_text.delta",
                "response.reasoning_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.done",
                "response.output_item.done",
            ]
        );
        let json = serde_json::to_value(&output).unwrap();
        assert_eq!(
            json,
            serde_json::json!([
                {"type": "reasoning", "id": "rs_7_0", "summary": [], "status": "completed",
                 "content": [{"type": "reasoning_text", "text": "think more"}]},
                {"type": "message", "id": "msg_7_1", "role": "assistant", "status": "completed",
                 "content": [{"type": "output_text", "text": "Hi", "annotations": [], "logprobs": []}]},
                {"type": "function_call", "id": "fc_7_2", "call_id": "call_a", "name": "f",
                 "arguments": "{\"x\": 1}", "status": "completed"}
            ])
        );
        // Each done item is the one the events describe, at its index.
        let dones: Vec<(usize, &OutputItem)> = events
            .iter()
            .filter_map(|e| match e {
                StreamEvent::OutputItemDone { output_index, item } => Some((*output_index, item)),
                _ => None,
            })
            .collect();
        assert_eq!(dones, [(0, &output[0]), (1, &output[1]), (2, &output[2])]);
    }

    #[test]
    fn a_cut_output_leaves_its_last_item_incomplete() {
        let mut builder = OutputBuilder::new("1");
        let mut events = Vec::new();
        builder.push(Delta::Reasoning("half".into()), &mut events);
        assert!(builder.in_reasoning());
        let output = builder.finish(true, &mut events);
        assert!(matches!(
            &output[..],
            [OutputItem::Reasoning {
                status: "incomplete",
                ..
            }]
        ));
        assert!(
            OutputBuilder::new("2")
                .finish(false, &mut events)
                .is_empty()
        );
    }
}

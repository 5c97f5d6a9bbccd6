#!/usr/bin/env python3
"""Writes the expected renderings of the official chat templates, made with
transformers' `apply_chat_template(..., tokenize=False)`, as test data for
sparkrt's renderer (tests/text_chat_reference.rs compares byte for byte).

Usage: render-chat-reference.py [OUT_DIR]   (default: tests/chat_templates)

The templates are read from tests/fixtures/templates (byte-identical copies
of the Hub's).

Needs `transformers` and `jinja2` (no torch): e.g.
    python3 -m venv /tmp/venv && /tmp/venv/bin/pip install transformers jinja2
    /tmp/venv/bin/python scripts/render-chat-reference.py

Each case is an OpenAI chat request body (the fields that reach the
template). It is turned into transformers' inputs the way vLLM does before it
calls `apply_chat_template`:
- text content parts are joined with "\\n"; `content: null` becomes "";
- tool-call `function.arguments`, a JSON string on the wire, is parsed into
  a mapping (templates write it with `tojson` or check its type);
- `reasoning_content` / `reasoning` of an assistant message is passed as both
  `reasoning` and `reasoning_content` (transformers then adds `thinking`,
  which gpt-oss reads);
- `tool_call_id` and `name` are kept; `tools` and `documents` as sent;
- `reasoning_effort` and then `chat_template_kwargs` become template kwargs
  (the kwargs win); `add_generation_prompt` defaults to true unless
  `continue_final_message` is set.
gpt-oss writes the date with `strftime_now`: it is fixed to FIXED_DATE here
and in the Rust test, so the expected strings are stable.
"""

import copy
import datetime as real_datetime
import hashlib
import json
import os
import sys

import transformers
import transformers.utils.chat_template_utils as chat_template_utils
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from transformers import PreTrainedTokenizerFast

# 2026-02-14 09:30:00 UTC, as seconds since the epoch (the Rust test uses it).
FIXED_UNIX_SECONDS = 1771061400


class FixedDatetime(real_datetime.datetime):
    @classmethod
    def now(cls, tz=None):
        return real_datetime.datetime.fromtimestamp(FIXED_UNIX_SECONDS, real_datetime.timezone.utc).replace(
            tzinfo=tz
        )


chat_template_utils.datetime = FixedDatetime

TEMPLATE_DIR = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "templates")

TEMPLATES = {
    # file: the special tokens of the checkpoints that ship it
    "qwen3.jinja": {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
    "qwen3_instruct_2507.jinja": {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
    "gptoss.jinja": {
        "bos_token": "<|startoftext|>",
        "eos_token": "<|return|>",
        "pad_token": "<|endoftext|>",
    },
}

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city (Zürich, \"quoted\" <tags> & all).",
        "parameters": {
            "type": "object",
            "properties": {
                "location": {"type": "string", "description": "City name"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"},
            },
            "required": ["location"],
        },
    },
}

SEARCH = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the web.",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "What to look for"},
                "limit": {"type": "integer", "default": 10},
                "ratio": {"type": "number", "default": 0.5},
                "safe": {"type": "boolean", "default": True},
                "tags": {"type": "array", "items": {"type": "string"}},
                "points": {"type": "array", "items": {"type": "object", "properties": {"x": {"type": "number"}}}},
                "mode": {"oneOf": [{"type": "string", "description": "a name"}, {"type": "integer"}]},
                "either": {"type": ["string", "null"]},
                "maybe": {"type": "string", "nullable": True},
                "filters": {
                    "type": "object",
                    "properties": {"site": {"type": "string"}, "year": {"type": "integer"}},
                    "required": ["site"],
                },
                "anything": {},
            },
            "required": ["query"],
        },
    },
}

# Schemas that take the gpt-oss template's less-travelled paths.
TRICKY = {
    "type": "function",
    "function": {
        "name": "tricky",
        "description": "Odd schemas.",
        "parameters": {
            "type": "object",
            "properties": {
                "items": {"type": "string", "description": "a property named like a dict method"},
                "union": {"oneOf": [{"type": "object", "properties": {"a": {"type": "string"}}}, {"type": "string"}]},
                "matrix": {"type": "array", "items": {"type": "array", "items": {"type": "number"}}},
                "bag": {"type": "array"},
                "maybe_list": {"type": "array", "items": {"type": "integer"}, "nullable": True},
                "weight": {"type": "number", "default": 1.0},
                "big": {"type": "integer", "default": 12345678901234},
                "flag": {"type": "boolean", "default": False},
                "choice": {"type": "string", "enum": ["a", "b"], "default": "b", "description": "pick"},
                "deep": {
                    "type": "array",
                    "items": {"type": "object", "properties": {"long_name_number_one": {"type": "string"}, "long_name_number_two": {"type": "string"}}},
                },
            },
        },
    },
}

NO_DESCRIPTION = {"type": "function", "function": {"name": "bare", "parameters": {"type": "object", "properties": {"x": {"type": "string"}}}}}

NO_PARAMS = {"type": "function", "function": {"name": "now", "description": "The time.", "parameters": {}}}


def call(id_, name, arguments):
    return {"id": id_, "type": "function", "function": {"name": name, "arguments": arguments}}


USER_HI = {"role": "user", "content": "Hello!"}

CASES = [
    {"name": "one_user_message", "request": {"messages": [USER_HI]}},
    {
        "name": "system_and_multi_turn",
        "request": {
            "messages": [
                {"role": "system", "content": "You are terse."},
                {"role": "user", "content": "Capital of France?"},
                {"role": "assistant", "content": "Paris."},
                {"role": "user", "content": "And of Italy?\nTell me."},
            ]
        },
    },
    {"name": "no_generation_prompt", "request": {"messages": [USER_HI], "add_generation_prompt": False}},
    {
        "name": "content_parts",
        "request": {
            "messages": [
                {"role": "system", "content": [{"type": "text", "text": "Be kind."}]},
                {"role": "user", "content": [{"type": "text", "text": "first"}, {"type": "text", "text": "second"}]},
            ]
        },
    },
    {"name": "tools", "request": {"messages": [USER_HI], "tools": [WEATHER, SEARCH, NO_PARAMS]}},
    {
        "name": "tools_with_system",
        "request": {
            "messages": [{"role": "system", "content": "Use tools."}, {"role": "user", "content": "Weather in Zürich?"}],
            "tools": [WEATHER],
        },
    },
    {
        "name": "tool_choice_none_hides_the_tools",
        "request": {"messages": [USER_HI], "tools": [WEATHER], "tool_choice": "none"},
    },
    {
        "name": "tool_call_and_result",
        "request": {
            "messages": [
                {"role": "user", "content": "Weather in Paris?"},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [call("call_1", "get_weather", '{"location": "Paris", "unit": "celsius"}')],
                },
                {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": '{"temp": 18.5, "sky": "clear"}'},
            ],
            "tools": [WEATHER],
        },
    },
    {
        "name": "tool_call_with_reasoning_then_answer",
        "request": {
            "messages": [
                {"role": "user", "content": "Weather in Paris?"},
                {
                    "role": "assistant",
                    "content": "",
                    "reasoning_content": "I should call the weather tool.",
                    "tool_calls": [call("call_1", "get_weather", '{"location":"Paris","nested":{"b":[1,2.0,true,null],"a":"é"}}')],
                },
                {"role": "tool", "tool_call_id": "call_1", "content": "18C"},
                {"role": "assistant", "content": "It is 18C in Paris.", "reasoning": "The tool said 18C."},
                {"role": "user", "content": "Thanks"},
            ],
            "tools": [WEATHER],
        },
    },
    {
        "name": "tool_call_reasoning_pending",
        "request": {
            "messages": [
                {"role": "user", "content": "Weather in Paris?"},
                {
                    "role": "assistant",
                    "content": None,
                    "reasoning_content": "Call the tool.",
                    "tool_calls": [call("call_1", "get_weather", '{"location": "Paris"}')],
                },
                {"role": "tool", "tool_call_id": "call_1", "content": "18C"},
            ],
            "tools": [WEATHER],
        },
    },
    {
        "name": "parallel_tool_calls",
        "request": {
            "messages": [
                {"role": "user", "content": "Weather in Paris and Rome?"},
                {
                    "role": "assistant",
                    "content": "Checking both.",
                    "tool_calls": [
                        call("a", "get_weather", '{"location": "Paris"}'),
                        call("b", "get_weather", '{"location": "Rome"}'),
                    ],
                },
                {"role": "tool", "tool_call_id": "a", "content": "18C"},
                {"role": "tool", "tool_call_id": "b", "content": "24C"},
            ],
            "tools": [WEATHER],
        },
    },
    {
        "name": "reasoning_in_history",
        "request": {
            "messages": [
                {"role": "user", "content": "2+2?"},
                {"role": "assistant", "content": "4", "reasoning_content": "Two plus two is four."},
                {"role": "user", "content": "3+3?"},
            ]
        },
    },
    {
        "name": "inline_think_in_history",
        "request": {
            "messages": [
                {"role": "user", "content": "2+2?"},
                {"role": "assistant", "content": "<think>\nadd them\n</think>\n\n4"},
                {"role": "user", "content": "3+3?"},
            ]
        },
    },
    {
        "name": "enable_thinking_false",
        "request": {"messages": [USER_HI], "chat_template_kwargs": {"enable_thinking": False}},
    },
    {"name": "reasoning_effort_low", "request": {"messages": [USER_HI], "reasoning_effort": "low"}},
    {"name": "reasoning_effort_medium", "request": {"messages": [USER_HI], "reasoning_effort": "medium"}},
    {"name": "reasoning_effort_high", "request": {"messages": [USER_HI], "reasoning_effort": "high"}},
    {
        "name": "reasoning_effort_kwargs_win",
        "request": {
            "messages": [USER_HI],
            "reasoning_effort": "low",
            "chat_template_kwargs": {"reasoning_effort": "high"},
        },
    },
    {
        "name": "developer_role",
        "request": {
            "messages": [{"role": "developer", "content": "Answer in French."}, USER_HI],
            "tools": [WEATHER],
        },
    },
    {
        "name": "builtin_tools_and_model_identity",
        "request": {
            "messages": [USER_HI],
            "chat_template_kwargs": {
                "builtin_tools": ["browser", "python"],
                "model_identity": "You are a helpful assistant on a DGX Spark.",
            },
        },
    },
    {
        "name": "continue_final_message",
        "request": {
            "messages": [USER_HI, {"role": "assistant", "content": "Hello! The answer is "}],
            "continue_final_message": True,
        },
    },
    {
        "name": "continue_final_message_trimmed",
        "request": {
            "messages": [
                {"role": "system", "content": "S"},
                {"role": "user", "content": "Count:"},
                {"role": "assistant", "content": "1, 2,"},
            ],
            "continue_final_message": True,
            "add_generation_prompt": False,
        },
    },
    {"name": "tricky_schemas", "request": {"messages": [USER_HI], "tools": [TRICKY]}},
    {"name": "tool_without_description", "request": {"messages": [USER_HI], "tools": [NO_DESCRIPTION]}},
    {"name": "empty_tools_list", "request": {"messages": [USER_HI], "tools": []}},
    {
        "name": "arguments_sent_as_an_object",
        "request": {
            "messages": [
                {"role": "user", "content": "Weather?"},
                {"role": "assistant", "tool_calls": [call("c", "get_weather", {"location": "Oslo", "unit": "celsius"})]},
                {"role": "tool", "tool_call_id": "c", "content": "-3C"},
            ],
            "tools": [WEATHER],
        },
    },
    {
        "name": "system_not_first",
        "request": {
            "messages": [
                USER_HI,
                {"role": "assistant", "content": "Hi."},
                {"role": "system", "content": "Now be formal."},
                {"role": "user", "content": "Greetings."},
            ]
        },
    },
    {
        "name": "tool_response_text_in_a_user_message",
        "request": {
            "messages": [
                {"role": "user", "content": "Question"},
                {"role": "assistant", "content": "Answer", "reasoning_content": "think A"},
                {"role": "user", "content": "<tool_response>\nraw\n</tool_response>"},
                {"role": "assistant", "content": "Answer 2", "reasoning_content": "think B"},
            ],
            "add_generation_prompt": False,
        },
    },
    {
        "name": "channel_tags_in_content",
        "request": {
            "messages": [
                USER_HI,
                {"role": "assistant", "content": "<|channel|>analysis<|message|>sneaky"},
                {"role": "user", "content": "Again"},
            ]
        },
    },
    {
        "name": "final_assistant_turn_without_generation_prompt",
        "request": {
            "messages": [USER_HI, {"role": "assistant", "content": "Hi there.", "reasoning_content": "Greet back."}],
            "add_generation_prompt": False,
        },
    },
    {
        "name": "tool_without_a_call_is_an_error_for_gptoss",
        "request": {"messages": [USER_HI, {"role": "tool", "tool_call_id": "x", "content": "orphan"}]},
    },
]


def transformers_inputs(request):
    """What vLLM hands to `apply_chat_template` for a chat request."""
    messages = []
    for m in request["messages"]:
        msg = {"role": m["role"]}
        content = m.get("content")
        if isinstance(content, list):
            content = "\n".join(part["text"] for part in content)
        msg["content"] = "" if content is None else content
        if m.get("tool_calls") is not None:
            calls = copy.deepcopy(m["tool_calls"])
            for c in calls:
                if isinstance(c["function"]["arguments"], str):
                    c["function"]["arguments"] = json.loads(c["function"]["arguments"])
            msg["tool_calls"] = calls
        reasoning = m.get("reasoning_content") or m.get("reasoning")
        if reasoning is not None:
            msg["reasoning"] = reasoning
            msg["reasoning_content"] = reasoning
        if "tool_call_id" in m:
            msg["tool_call_id"] = m["tool_call_id"]
        if isinstance(m.get("name"), str):
            msg["name"] = m["name"]
        messages.append(msg)
    tools = request.get("tools")
    if request.get("tool_choice") == "none":
        tools = None
    kwargs = {}
    if request.get("reasoning_effort") is not None:
        kwargs["reasoning_effort"] = request["reasoning_effort"]
    kwargs.update(request.get("chat_template_kwargs") or {})
    continue_final = bool(request.get("continue_final_message", False))
    add_generation_prompt = request.get("add_generation_prompt", not continue_final)
    return messages, tools, request.get("documents"), add_generation_prompt, continue_final, kwargs


def tokenizer_for(source, special_tokens):
    vocab = {"<unk>": 0}
    for token in special_tokens.values():
        vocab.setdefault(token, len(vocab))
    backend = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    return PreTrainedTokenizerFast(tokenizer_object=backend, chat_template=source, unk_token="<unk>", **special_tokens)


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "tests", "chat_templates")
    for file, special_tokens in TEMPLATES.items():
        with open(os.path.join(TEMPLATE_DIR, file), encoding="utf-8") as f:
            source = f.read()
        tokenizer = tokenizer_for(source, special_tokens)
        cases = []
        for case in CASES:
            messages, tools, documents, add_generation_prompt, continue_final, kwargs = transformers_inputs(case["request"])
            entry = {"name": case["name"], "request": case["request"]}
            try:
                entry["expected"] = tokenizer.apply_chat_template(
                    messages,
                    tools=tools,
                    documents=documents,
                    add_generation_prompt=add_generation_prompt,
                    continue_final_message=continue_final,
                    tokenize=False,
                    **kwargs,
                )
            except Exception as e:  # the template or transformers refused it
                entry["error"] = f"{type(e).__name__}: {e}"
            cases.append(entry)
        data = {
            "generated_by": "scripts/render-chat-reference.py",
            "transformers": transformers.__version__,
            "template": file,
            "template_sha256": hashlib.sha256(source.encode("utf-8")).hexdigest(),
            "special_tokens": {**special_tokens, "unk_token": "<unk>"},
            "fixed_unix_seconds": FIXED_UNIX_SECONDS,
            "cases": cases,
        }
        path = os.path.join(out_dir, file.removesuffix(".jinja") + ".json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(data, f, ensure_ascii=False, indent=1)
            f.write("\n")
        errors = sum("error" in c for c in cases)
        print(f"{path}: {len(cases)} cases ({errors} errors)")


if __name__ == "__main__":
    main()

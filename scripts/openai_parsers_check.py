#!/usr/bin/env python3
"""Reasoning and tool calls from a scripted checkpoint, through the official
`openai` client (and LangChain's `bind_tools`, where langchain-openai is
installed; `--require-langchain` makes its absence a failure).

Usage: openai_parsers_check.py BASE_URL EXPECTED_JSON [--require-langchain]

EXPECTED_JSON: {"reasoning": str|null, "content": str|null,
                "tool": {"name": str, "arguments": {...}}|null}
               or, for several calls, "tools": [{"name": ..., "arguments": ...}, ...]
The server's model writes exactly that answer (a scripted checkpoint), so
the blocking answer, the stream and LangChain must all give it back.
"""

import json
import sys

import openai

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]


def check(condition, what):
    if not condition:
        raise SystemExit(f"FAILED: {what}")
    print(f"ok: {what}")


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    require_langchain = "--require-langchain" in sys.argv
    if len(args) != 2:
        raise SystemExit(__doc__)
    base_url = args[0].rstrip("/") + "/v1"
    expected = json.loads(args[1])
    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=300)
    model = client.models.list().data[0].id
    messages = [{"role": "user", "content": "Hi"}]
    tools = expected.get("tools") or ([expected["tool"]] if expected.get("tool") else [])

    # Blocking.
    # Tools are offered: the server parses tool calls only then (as vLLM).
    answer = client.chat.completions.create(model=model, messages=messages, tools=TOOLS, temperature=0)
    message = answer.choices[0].message
    extra = message.model_extra or {}
    check(extra.get("reasoning_content") == expected["reasoning"],
          f"reasoning_content {extra.get('reasoning_content')!r}")
    check(message.content == expected["content"], f"content {message.content!r}")
    if tools:
        check(message.tool_calls is not None and len(message.tool_calls) == len(tools),
              f"{len(tools)} tool call(s): {message.tool_calls}")
        for call, tool in zip(message.tool_calls, tools):
            check(call.id.startswith("call_") and call.type == "function", f"call id/type {call}")
            check(call.function.name == tool["name"], f"function name {call.function.name}")
            check(json.loads(call.function.arguments) == tool["arguments"],
                  f"arguments {call.function.arguments}")
        check(answer.choices[0].finish_reason == "tool_calls", "finish_reason tool_calls")
    else:
        check(not message.tool_calls, "no tool calls")
        check(answer.choices[0].finish_reason == "stop", "finish_reason stop")

    # Streamed: the pieces add up to the same answer.
    reasoning, content, calls, finish = "", "", {}, None
    for chunk in client.chat.completions.create(
        model=model, messages=messages, tools=TOOLS, temperature=0, stream=True
    ):
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        delta = choice.delta
        reasoning += (delta.model_extra or {}).get("reasoning_content") or ""
        content += delta.content or ""
        for piece in delta.tool_calls or []:
            call = calls.setdefault(piece.index, {"id": None, "name": None, "arguments": ""})
            if piece.id:
                call["id"] = piece.id
            if piece.function and piece.function.name:
                call["name"] = piece.function.name
            if piece.function and piece.function.arguments:
                call["arguments"] += piece.function.arguments
        finish = choice.finish_reason or finish
    check(reasoning == (expected["reasoning"] or ""), f"streamed reasoning {reasoning!r}")
    check(content == (expected["content"] or ""), f"streamed content {content!r}")
    if tools:
        check(len(calls) == len(tools), f"streamed calls {calls}")
        for i, tool in enumerate(tools):
            check(calls[i]["name"] == tool["name"], f"streamed call {calls[i]}")
            check(json.loads(calls[i]["arguments"]) == tool["arguments"], "streamed arguments")
        check(finish == "tool_calls", f"streamed finish {finish}")
    else:
        check(not calls and finish == "stop", f"streamed: no calls, finish {finish}")

    # LangChain.
    try:
        from langchain_openai import ChatOpenAI
    except ImportError as e:
        if require_langchain:
            raise SystemExit(f"FAILED: langchain-openai is not installed: {e}")
        print(f"skipped: langchain-openai is not installed ({e})")
    else:
        llm = ChatOpenAI(model=model, base_url=base_url, api_key="unused", temperature=0,
                         max_retries=0)
        # Until the request side takes `tools` (issue 15's input half), a
        # server refuses the field by name; then there is nothing to check.
        probe = client.chat.completions.with_raw_response
        try:
            probe.create(model=model, messages=messages, tools=TOOLS, max_tokens=1)
        except openai.BadRequestError as e:
            if "'tools' is not supported" not in str(e):
                raise
            print(f"skipped langchain: this server does not take `tools` yet ({e})")
            print("openai parsers check passed")
            return
        reply = llm.bind_tools(TOOLS).invoke("Hi")
        if tools:
            got = [(c["name"], c["args"]) for c in reply.tool_calls]
            check(got == [(t["name"], t["arguments"]) for t in tools],
                  f"langchain tool_calls {reply.tool_calls}")
        else:
            check(reply.tool_calls == [] and reply.content == (expected["content"] or ""),
                  f"langchain content {reply.content!r}")
    print("openai parsers check passed")


if __name__ == "__main__":
    main()

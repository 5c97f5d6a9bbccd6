#!/usr/bin/env python3
"""Talks to a running `sparkrt serve` through the official `openai` client's
Responses API (`client.responses.create`, blocking and `stream=True`).

Usage: openai_responses_check.py BASE_URL
       openai_responses_check.py BASE_URL --expect JSON

With --expect, the server runs a scripted checkpoint and JSON says what its
answer is: {"reasoning": TEXT or null, "content": TEXT or null, "tool":
{"name", "arguments"} or null}; the check is then that `output` holds exactly
those items, blocking and streamed, and that the stream's events build them.

The server is expected to run a model whose chat template renders tools
(e.g. `--chat-template tests/fixtures/templates/qwen3.jinja`). Checks that the
blocking and the streamed answer give the same greedy output, that the
events come in the Responses API's order and build up the final response,
that usage adds up, that input items (messages, function calls and their
outputs, reasoning) and flat function tools reach the prompt, and that
`previous_response_id` is refused as a BadRequestError naming it. Prints one
line per check and exits non-zero on the first failure.
"""

import json
import sys

import openai


def check(condition, what):
    if not condition:
        raise SystemExit(f"FAILED: {what}")
    print(f"ok: {what}")


WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
    "strict": True,
}


def expect_scripted(client, model, expected):
    """The scripted answer as reasoning / message / function_call items."""
    blocking = client.responses.create(model=model, input="Hi", tools=[WEATHER], temperature=0)
    events = list(client.responses.create(model=model, input="Hi", tools=[WEATHER], temperature=0, stream=True))
    final = events[-1].response
    check(events[-1].type == "response.completed", f"the stream completes: {events[-1].type}")
    for name, response in (("blocking", blocking), ("streamed", final)):
        check(response.status == "completed", f"{name}: completed")
        by_type = {}
        for item in response.output:
            by_type.setdefault(item.type, []).append(item)
        want_types = [t for t, key in (("reasoning", "reasoning"), ("message", "content"), ("function_call", "tool"))
                      if expected[key] is not None]
        check([i.type for i in response.output] == want_types, f"{name}: items {[i.type for i in response.output]}")
        if expected["reasoning"] is not None:
            item = by_type["reasoning"][0]
            check(item.content[0].text == expected["reasoning"], f"{name}: reasoning {item.content!r}")
        if expected["content"] is not None:
            check(response.output_text == expected["content"], f"{name}: output_text {response.output_text!r}")
        if expected["tool"] is not None:
            call = by_type["function_call"][0]
            check(call.name == expected["tool"]["name"], f"{name}: function name {call.name}")
            check(json.loads(call.arguments) == expected["tool"]["arguments"], f"{name}: arguments {call.arguments}")
            check(call.call_id.startswith("call_"), f"{name}: call id {call.call_id}")
    reasoning = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    arguments = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    check(reasoning == (expected["reasoning"] or ""), f"reasoning deltas add up: {reasoning!r}")
    if expected["tool"] is not None:
        done = [e for e in events if e.type == "response.function_call_arguments.done"]
        check(len(done) == 1 and done[0].arguments == arguments, "the arguments deltas add up")
        check(json.loads(arguments) == expected["tool"]["arguments"], f"streamed arguments {arguments}")
    print("openai responses check passed")


def main():
    if len(sys.argv) == 4 and sys.argv[2] == "--expect":
        client = openai.OpenAI(base_url=sys.argv[1].rstrip("/") + "/v1", api_key="unused", max_retries=0, timeout=300)
        return expect_scripted(client, client.models.list().data[0].id, json.loads(sys.argv[3]))
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    client = openai.OpenAI(base_url=sys.argv[1].rstrip("/") + "/v1", api_key="unused", max_retries=0, timeout=300)
    model = client.models.list().data[0].id

    blocking = client.responses.create(
        model=model, input="Hello there", instructions="Be brief.", max_output_tokens=8, temperature=0
    )
    check(blocking.object == "response", f"a response object: {blocking.object}")
    check(blocking.id.startswith("resp_"), f"a response id: {blocking.id}")
    check(blocking.status == "incomplete", f"cut at max_output_tokens: {blocking.status}")
    check(
        blocking.incomplete_details is not None and blocking.incomplete_details.reason == "max_output_tokens",
        f"why it is incomplete: {blocking.incomplete_details}",
    )
    check(blocking.usage.output_tokens == 8, f"8 output tokens: {blocking.usage}")
    check(
        blocking.usage.total_tokens == blocking.usage.input_tokens + blocking.usage.output_tokens,
        "usage adds up",
    )
    types = [item.type for item in blocking.output]
    check(all(t in ("message", "reasoning", "function_call") for t in types), f"output items: {types}")
    check(blocking.instructions == "Be brief.", "the instructions are repeated")

    events = list(
        client.responses.create(
            model=model,
            input="Hello there",
            instructions="Be brief.",
            max_output_tokens=8,
            temperature=0,
            stream=True,
        )
    )
    kinds = [e.type for e in events]
    check(kinds[:2] == ["response.created", "response.in_progress"], f"the stream opens: {kinds[:2]}")
    check(kinds[-1] == "response.incomplete", f"the stream ends incomplete: {kinds[-1]}")
    check(
        [e.sequence_number for e in events] == list(range(len(events))),
        "events are numbered in order",
    )
    final = events[-1].response
    check(final.output_text == blocking.output_text, "the streamed output equals the blocking one")
    check(final.usage.output_tokens == 8, f"streamed usage: {final.usage}")
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    done = [e.text for e in events if e.type == "response.output_text.done"]
    check(text == final.output_text, "the text deltas add up to the output text")
    check(done == ([text] if text else []), f"output_text.done carries the whole text: {done}")
    added = [e.item.type for e in events if e.type == "response.output_item.added"]
    finished = [e.item for e in events if e.type == "response.output_item.done"]
    check(added == [item.type for item in final.output], f"one added event per item: {added}")
    check([i.id for i in finished] == [i.id for i in final.output], "one done event per item")
    if "message" in added:
        parts = [e.part.type for e in events if e.type == "response.content_part.added"]
        check("output_text" in parts, f"the message's content part is announced: {parts}")

    # A whole tool-using conversation as input items, with flat tools.
    history = [
        {"role": "user", "content": "Weather in Paris?"},
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "Use the tool."}]},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "18C and sunny"},
    ]
    with_tools = client.responses.create(model=model, input=history, tools=[WEATHER], max_output_tokens=2)
    without = client.responses.create(model=model, input=history, max_output_tokens=2)
    check(
        with_tools.usage.input_tokens > without.usage.input_tokens + 20,
        f"the tools reach the prompt: {with_tools.usage.input_tokens} vs {without.usage.input_tokens} tokens",
    )
    check(with_tools.tools[0].name == "get_weather", "the tools are repeated")

    try:
        client.responses.create(model=model, input="hi", previous_response_id=blocking.id)
        check(False, "previous_response_id is refused")
    except openai.BadRequestError as e:
        check(e.status_code == 400 and "previous_response_id" in str(e), f"previous_response_id is a 400: {e}")
    print("openai responses check passed")


if __name__ == "__main__":
    main()

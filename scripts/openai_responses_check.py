#!/usr/bin/env python3
"""Talks to a running `sparkrt serve` through the official `openai` client's
Responses API (`client.responses.create`, blocking and `stream=True`).

Usage: openai_responses_check.py BASE_URL

The server is expected to run a model whose chat template renders tools
(e.g. `--chat-template tests/fixtures/templates/qwen3.jinja`). Checks that the
blocking and the streamed answer give the same greedy output, that the
events come in the Responses API's order and build up the final response,
that usage adds up, that input items (messages, function calls and their
outputs, reasoning) and flat function tools reach the prompt, and that
`previous_response_id` is refused as a BadRequestError naming it. Prints one
line per check and exits non-zero on the first failure.
"""

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


def main():
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

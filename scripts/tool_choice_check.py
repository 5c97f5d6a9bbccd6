#!/usr/bin/env python3
"""tool_choice "required" and a named function on a running `sparkrt serve`,
through the clients whose structured-output modes use them.

Usage: tool_choice_check.py BASE_URL

The model is the tiny random fixture: without the grammar it never writes a
tool call, so every call here is the constraint's work. Checks, through the
official openai client, that `required` (with parallel_tool_calls false)
answers exactly one call to an offered tool and a named function a call to
it, blocking and streamed alike, with arguments valid against the tool's
schema (jsonschema, an independent validator); and through langchain-openai
that `with_structured_output(Model, method="function_calling", strict=True)`, which sends
a named tool_choice, returns a parsed object, as do instructor's Mode.TOOLS
(a named tool_choice) and pydantic-ai's `output_type=Model` (an output tool
under tool_choice "required"). Exits non-zero on the first failure.
"""

import json
import sys

import jsonschema
import openai

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 8}},
    "required": ["city"],
    "additionalProperties": False,
}
ADD = {
    "type": "object",
    # Bounded: a random model would write digits up to max_tokens.
    "properties": {
        "a": {"type": "integer", "minimum": 0, "maximum": 99},
        "b": {"type": "integer", "minimum": 0, "maximum": 99},
    },
    "required": ["a", "b"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "add", "parameters": ADD}},
]
SCHEMAS = {"get_weather": WEATHER, "add": ADD}


def check(condition, what):
    if not condition:
        raise SystemExit(f"FAILED: {what}")
    print(f"ok: {what}")


def valid_call(name, arguments, what):
    check(name in SCHEMAS, f"{what}: {name!r} is an offered tool")
    jsonschema.validate(json.loads(arguments), SCHEMAS[name])
    print(f"ok: {what}: arguments {arguments} valid against {name}'s schema")


def streamed_calls(stream):
    calls = {}
    finish = None
    for chunk in stream:
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        finish = choice.finish_reason or finish
        for delta in choice.delta.tool_calls or []:
            call = calls.setdefault(delta.index, {"name": "", "arguments": ""})
            if delta.function.name:
                call["name"] += delta.function.name
            if delta.function.arguments:
                call["arguments"] += delta.function.arguments
    return [calls[i] for i in sorted(calls)], finish


def main():
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    base_url = sys.argv[1].rstrip("/") + "/v1"
    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=300)
    model = client.models.list().data[0].id
    messages = [{"role": "user", "content": "Hi"}]

    for tool_choice, parallel, wanted in [
        ("required", False, None),
        ({"type": "function", "function": {"name": "add"}}, None, "add"),
        ({"type": "function", "function": {"name": "get_weather"}}, None, "get_weather"),
    ]:
        extra = {} if parallel is None else {"parallel_tool_calls": parallel}
        what = f"tool_choice={json.dumps(tool_choice)}"
        answer = client.chat.completions.create(
            model=model, messages=messages, tools=TOOLS, tool_choice=tool_choice,
            max_tokens=200, temperature=0, **extra,
        )
        choice = answer.choices[0]
        calls = choice.message.tool_calls or []
        check(len(calls) == 1, f"{what}: one call ({len(calls)})")
        check(choice.finish_reason == "tool_calls", f"{what}: finish_reason {choice.finish_reason}")
        valid_call(calls[0].function.name, calls[0].function.arguments, what)
        if wanted:
            check(calls[0].function.name == wanted, f"{what}: the named function is called")
        streamed, finish = streamed_calls(client.chat.completions.create(
            model=model, messages=messages, tools=TOOLS, tool_choice=tool_choice,
            max_tokens=200, temperature=0, stream=True, **extra,
        ))
        check(
            [(c["name"], c["arguments"]) for c in streamed]
            == [(calls[0].function.name, calls[0].function.arguments)],
            f"{what}: streamed the same call",
        )
        check(finish == "tool_calls", f"{what}: streamed finish_reason {finish}")

    from langchain_openai import ChatOpenAI
    from pydantic import BaseModel, Field

    class Add(BaseModel):
        """Adds two integers."""

        a: int = Field(ge=0, le=99)
        b: int = Field(ge=0, le=99)

    llm = ChatOpenAI(model=model, base_url=base_url, api_key="unused", temperature=0,
                     max_tokens=200, max_retries=0)
    # strict=True: langchain then closes the schema (additionalProperties
    # false), as OpenAI's strict mode requires; an open schema lets a random
    # model write extra keys until max_tokens.
    structured = llm.with_structured_output(Add, method="function_calling", strict=True)
    result = structured.invoke("Add 2 and 3")
    check(isinstance(result, Add), f"langchain function_calling returns an Add: {result!r}")

    # Closed (additionalProperties false): the schema instructor and
    # pydantic-ai send is pydantic's, open unless the model forbids extras.
    from pydantic import ConfigDict

    class ClosedAdd(Add):
        model_config = ConfigDict(extra="forbid")

    # instructor's default mode (Mode.TOOLS) sends a named tool_choice.
    import instructor

    patched = instructor.from_openai(client, mode=instructor.Mode.TOOLS)
    result = patched.chat.completions.create(
        model=model, response_model=ClosedAdd, messages=[{"role": "user", "content": "Add 2 and 3"}],
        max_tokens=200, temperature=0, max_retries=1,
    )
    check(isinstance(result, ClosedAdd), f"instructor Mode.TOOLS returns an Add: {result!r}")

    # pydantic-ai's output_type=Model answers through an output tool with
    # tool_choice "required" (text is not an allowed output).
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    agent = Agent(
        OpenAIChatModel(model, provider=OpenAIProvider(base_url=base_url, api_key="unused")),
        output_type=ClosedAdd,
        retries=0,
    )
    run = agent.run_sync("Add 2 and 3", model_settings={"temperature": 0, "max_tokens": 200})
    check(isinstance(run.output, ClosedAdd), f"pydantic-ai output_type=Add returns an Add: {run.output!r}")
    print("tool choice check passed")


if __name__ == "__main__":
    main()

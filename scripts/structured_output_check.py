#!/usr/bin/env python3
"""Structured outputs through the official `openai` client, checked by
`jsonschema`: for each schema (nested objects, enums, arrays, required
fields, patterns), 50 seeded samples at temperature 1 from a running
`sparkrt serve` must parse and validate. Also json_object (a JSON object),
guided_choice (one of the choices) and guided_regex (a full match).

Usage: structured_output_check.py http://127.0.0.1:PORT
Prints "all structured outputs valid" and exits 0, or lists the failures
and exits 1. (tests/server_sampling.rs runs it.)
"""

import json
import re
import sys
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import openai

SAMPLES = 50
MAX_TOKENS = 400

SCHEMAS = {
    "nested": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 6},
            "address": {
                "type": "object",
                "properties": {
                    "zip": {"type": "integer", "minimum": 0, "maximum": 999},
                    "city": {"enum": ["Oslo", "Lima", "Kyiv"]},
                },
                "required": ["zip", "city"],
                "additionalProperties": False,
            },
        },
        "required": ["name", "address"],
        "additionalProperties": False,
    },
    "array": {
        "type": "object",
        "properties": {
            "tags": {
                "type": "array",
                "items": {"enum": ["red", "green", "blue"]},
                "minItems": 1,
                "maxItems": 4,
            },
            "ok": {"type": "boolean"},
        },
        "required": ["tags", "ok"],
        "additionalProperties": False,
    },
    "pattern": {
        "type": "object",
        "properties": {
            "code": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"},
            "count": {"type": "integer", "minimum": -5, "maximum": 5},
        },
        "required": ["code", "count"],
        "additionalProperties": False,
    },
    "list_of_objects": {
        "type": "array",
        "items": {
            "type": "object",
            "properties": {
                "id": {"type": "integer", "minimum": 1, "maximum": 9},
                "kind": {"enum": ["x", "y"]},
            },
            "required": ["id", "kind"],
            "additionalProperties": False,
        },
        "minItems": 1,
        "maxItems": 3,
    },
}


def main() -> int:
    url = sys.argv[1]
    client = openai.OpenAI(base_url=url + "/v1", api_key="none")
    failures = []
    jobs = []

    def chat(seed, **kwargs):
        answer = client.chat.completions.create(
            model="qwen3-moe-tiny",
            messages=[{"role": "user", "content": "Answer in JSON."}],
            temperature=1.0,
            seed=seed,
            max_tokens=MAX_TOKENS,
            **kwargs,
        )
        choice = answer.choices[0]
        return choice.message.content, choice.finish_reason

    def check_schema(name, schema, seed):
        text, finish = chat(
            seed,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": name, "schema": schema, "strict": True},
            },
        )
        try:
            jsonschema.validate(json.loads(text), schema)
        except (ValueError, jsonschema.ValidationError) as e:
            return f"{name} seed {seed}: {text!r} ({finish}): {e}"
        if finish != "stop":
            return f"{name} seed {seed}: finish_reason {finish}"
        return None

    completed_objects = []

    def check_json_object(seed):
        text, finish = chat(seed, response_format={"type": "json_object"})
        if finish == "length":
            # A free-form object may run past max_tokens on a random model.
            return None
        completed_objects.append(text)
        try:
            value = json.loads(text)
        except ValueError as e:
            return f"json_object seed {seed}: {text!r}: {e}"
        return None if isinstance(value, dict) else f"json_object seed {seed}: {text!r}"

    def check_choice(seed):
        choices = ["alpha", "beta", "gamma delta"]
        text, _ = chat(seed, extra_body={"guided_choice": choices})
        return None if text in choices else f"guided_choice seed {seed}: {text!r}"

    def check_regex(seed):
        pattern = r"[a-c]{3}\.[0-9]{1,2}"
        text, _ = chat(seed, extra_body={"guided_regex": pattern})
        return None if re.fullmatch(pattern, text) else f"guided_regex seed {seed}: {text!r}"

    with ThreadPoolExecutor(max_workers=8) as pool:
        for name, schema in SCHEMAS.items():
            for seed in range(SAMPLES):
                jobs.append(pool.submit(check_schema, name, schema, seed))
        for seed in range(10):
            jobs.append(pool.submit(check_json_object, seed))
            jobs.append(pool.submit(check_choice, seed))
            jobs.append(pool.submit(check_regex, seed))
        for job in jobs:
            problem = job.result()
            if problem:
                failures.append(problem)
    print(f"json_object: {len(completed_objects)} of 10 completed, e.g. {completed_objects[:3]}")
    if not completed_objects:
        failures.append("json_object: no sample completed within max_tokens")
    if failures:
        print(f"{len(failures)} of {len(jobs)} checks failed:")
        for f in failures:
            print(" ", f)
        return 1
    print(f"all structured outputs valid ({len(jobs)} checks)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

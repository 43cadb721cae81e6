"""The tool-call parser never raises, and the calculator evaluates arithmetic without running code."""
from __future__ import annotations

from hypothesis import given, strategies as st

from hybridflow.agents import MalformedCall, ToolCall, ToolCallFormat, calculator, parse_tool_call
from hybridflow.agents.calc_env import CalcEnv, CalcPythonEnv


def test_calls_with_and_without_a_tool_name():
    assert parse_tool_call("[12+34+56]", tool_names=("calc",)) == ToolCall(None, "12+34+56")
    assert parse_tool_call("ok [calc: 2*3]", tool_names=("calc",)) == ToolCall("calc", "2*3")
    # a name prefix that is no tool is part of the arguments of the default tool
    assert parse_tool_call("[x: 3]", tool_names=("calc",)) == ToolCall(None, "x: 3")
    assert parse_tool_call("42") is None


def test_malformed_calls_are_values():
    assert isinstance(parse_tool_call("[12+3"), MalformedCall)          # never closed
    assert isinstance(parse_tool_call("[]"), MalformedCall)             # empty
    assert parse_tool_call("[1+[2]]") == ToolCall(None, "1+[2]")      # from the first opening to the last closing
    assert isinstance(parse_tool_call("[1+2] and more"), MalformedCall)  # text after the call
    assert isinstance(parse_tool_call(None), MalformedCall)  # type: ignore[arg-type]


@given(st.text(alphabet="[]{}:+-*/0123456789 calcx_()\n", max_size=40))
def test_the_parser_never_raises(text):
    result = parse_tool_call(text, ToolCallFormat(), ("calc",))
    assert result is None or isinstance(result, (ToolCall, MalformedCall))


def test_calculator_is_exact_and_refuses_code():
    assert calculator("12+34+56").output == "102"
    assert calculator("(7 - 10) * 3").output == "-9"
    assert calculator("7/2").output == "3.5"
    assert calculator("2**10").output == "1024"
    for bad in ("__import__('os').system('true')", "x+1", "[1,2]", "1/0", "2**1000", "9**9**9", "1+", "'a'*3"):
        result = calculator(bad)
        assert result.error is not None and result.output.startswith("error:"), bad


def test_calc_env_turns_answers_and_errors_into_observations():
    env = CalcEnv()
    assert env.reset({"prompt": "12+34+56=", "ground_truth": "102", "data_source": "agent_calc"}) == ""
    obs, reward, done, info = env.step("[12+34+56]")
    assert (obs, reward, done, info["tool_calls"], info["tool_errors"]) == ("{102}", 0.0, False, 1, 0)
    obs, reward, done, info = env.step("[12+34")
    assert obs.startswith("{error:") and not done and info["tool_errors"] == 1
    obs, reward, done, info = env.step("[python: print(1)]")  # calc has no python tool: the arguments go to calc
    assert obs.startswith("{error:") and info["tool_errors"] == 1
    assert env.step("102")[1:3] == (1.0, True)
    assert env.step("103")[1:3] == (0.0, True)


def test_calc_python_env_runs_the_sandbox():
    env = CalcPythonEnv()
    env.reset({"prompt": "", "ground_truth": "6"})
    obs, _, done, info = env.step("<tool>python: print(sum([1, 2, 3]))</tool>")
    assert obs == "<result>6\n</result>" and info["tool"] == "python" and info["tool_errors"] == 0 and not done

"""A failure the product put into words, shown as those words: without the stack of the code that
raised it.

The stages fail a step with `dagster.Failure` only for a reason they have described: an item that
failed or is dead, and why (engine/stage_run.py). Dagster 1.13 records every step failure with
the Python stack of its exception all the same, a `Failure`'s included: `dagster_event_sequence_for_step`
(dagster/_core/execution/plan/execute_plan.py, "case (2)") builds the event from `sys.exc_info()`,
and `serializable_error_info_from_exc_info` (dagster/_utils/error.py) keeps the traceback's
frames, of which there is always at least one. The UI prints them under the reason ("Stack
Trace:") whenever there are any, the run's failure repeats them, and the console loggers print
them too, so a dead video reads as a crash of the product. No setting of 1.13 leaves them out.

So the product's event log storage (instance_storage.py) keeps the error of such a failure as
its description alone (`described`), and `dataminer run` prints it on one line
(`one_line_console_logger`). A step that fails in any other way (an exception nobody described)
keeps its stack: that one is a fault to debug.

`dataminer run` prints those lines to the terminal itself (`console_on_the_terminal`): while a
run's steps execute, Dagster sends standard error into the run's compute-log file and copies the
file back with `tail -F`, which it stops when they end (dagster/_core/execution/compute_logs.py),
so a line logged in the last second, the step's failure among them, could miss the terminal.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TextIO

import dagster as dg
from dagster._core.events import JobFailureData
from dagster._core.execution.plan.objects import StepFailureData
from dagster._core.log_manager import LOG_RECORD_EVENT_ATTR
from dagster_shared.error import SerializableErrorInfo


def description(event: dg.DagsterEvent) -> str | None:
    """The description of a step's `dagster.Failure`, or of the run's failure that it caused;
    None for any other event."""
    data = event.event_specific_data
    if event.event_type == dg.DagsterEventType.STEP_FAILURE and isinstance(data, StepFailureData):
        failure = data.user_failure_data  # set by Dagster for a `dagster.Failure` only
        return failure.description if failure is not None else None
    if (
        event.event_type == dg.DagsterEventType.RUN_FAILURE
        and isinstance(data, JobFailureData)
        and data.first_step_failure_event is not None
        and data.error == data.first_step_failure_event.step_failure_data.error
    ):
        return description(data.first_step_failure_event)
    return None


def described(event: dg.DagsterEvent) -> dg.DagsterEvent:
    """`event` with the error of a described failure (`description`) replaced by the description
    alone, without stack, cause or context; any other event as it is."""
    text = description(event)
    if text is None:
        return event
    data = event.event_specific_data
    if isinstance(data, StepFailureData):
        error = _description_alone(text, data.error)
        return event._replace(event_specific_data=data._replace(error=error))
    assert isinstance(data, JobFailureData) and data.first_step_failure_event is not None
    first = described(data.first_step_failure_event)
    return event._replace(
        event_specific_data=data._replace(
            error=first.step_failure_data.error, first_step_failure_event=first
        )
    )


def _description_alone(text: str, error: SerializableErrorInfo | None) -> SerializableErrorInfo:
    return SerializableErrorInfo(
        message=text, stack=[], cls_name=error.cls_name if error is not None else None
    )


def _failure_on_one_line(record: logging.LogRecord) -> bool:
    """A console line about a described failure: Dagster's first line (which step or run failed)
    and the description, on one line, in place of the error and its stack."""
    event = getattr(record, LOG_RECORD_EVENT_ATTR, None)
    text = description(event) if isinstance(event, dg.DagsterEvent) else None
    if text is not None:
        headline = str(record.msg).split("\n", 1)[0]
        record.msg = f"{headline} {' '.join(text.split())}"
    return True


_TERMINAL: ContextVar[TextIO | None] = ContextVar("terminal", default=None)


@contextmanager
def console_on_the_terminal() -> Iterator[None]:
    """Inside, the console logger of the runs that this thread executes writes to standard error
    as it is on entry, through a descriptor of its own, not through the run's compute-log capture
    (module docstring). Where standard error has no descriptor (a test runner's stream), Dagster
    captures nothing either, and the logger writes to it as usual."""
    try:
        sys.stderr.flush()
        descriptor = os.dup(sys.stderr.fileno())
    except (AttributeError, OSError, ValueError):
        descriptor = None
    if descriptor is None:
        yield
        return
    encoding = getattr(sys.stderr, "encoding", None) or "utf-8"
    with os.fdopen(descriptor, "w", buffering=1, encoding=encoding, errors="replace") as terminal:
        token = _TERMINAL.set(terminal)
        try:
            yield
        finally:
            _TERMINAL.reset(token)


def _console_logger(init_context: dg.InitLoggerContext) -> logging.Logger:
    logger = dg.colored_console_logger.logger_fn(init_context)
    logger.addFilter(_failure_on_one_line)
    terminal = _TERMINAL.get()
    if terminal is None:
        return logger
    for handler in list(logger.handlers):  # each writes to whatever sys.stderr is at the time
        direct = logging.StreamHandler(terminal)
        direct.setLevel(handler.level)
        direct.setFormatter(handler.formatter)
        logger.removeHandler(handler)
        logger.addHandler(direct)
    return logger


one_line_console_logger = dg.LoggerDefinition(
    _console_logger,
    config_schema=dg.colored_console_logger.config_schema,
    description="Dagster's console logger, a described failure on one line without its stack.",
)

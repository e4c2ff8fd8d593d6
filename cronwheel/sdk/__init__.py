"""The Python worker SDK: `from cronwheel.sdk import Worker`.

    def handle(run):              # run.payload, run.attempt, run.scheduled_at ...
        return {"rows": 42}       # -> SUCCEEDED with this result
        # raise Exception(...)    # -> FAILED, retried if attempts are left
        # raise Fail("bad input", retryable=False)   # -> FAILED, no retry

    Worker(topic, handle, concurrency=4).run()   # until SIGTERM

See docs/workers.md for the protocol underneath, to write a worker in any language.
"""

from cronwheel.sdk.worker import Fail, Run, Worker

__all__ = ["Fail", "Run", "Worker"]

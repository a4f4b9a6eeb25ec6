"""``trl_zerostd/trainer/process_exit.py``: a process that made a trainer under a process group ends the group at exit
by itself, and only at exit. (That this removes the abort at exit of two-process runs is measured by ``python -m
tests.tools.stress_launches --kinds user-...``, not here: the abort is rare and timing-dependent.)"""

import subprocess
import sys
import textwrap

from tests.support.launching import free_port, run_from_root

SCRIPT = textwrap.dedent(
    """
    import atexit, os
    import torch.distributed as dist
    atexit.register(lambda: print("at exit, group initialised:", dist.is_initialized()))  # runs last (LIFO)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="{port}")
    dist.init_process_group("gloo", rank=0, world_size=1)

    class Accelerator:
        freed = False
        def free_memory(self):
            Accelerator.freed = True
            print("models and optimizers dropped")

    from trl_zerostd.trainer.process_exit import end_process_group_at_exit
    accelerator = Accelerator()
    end_process_group_at_exit(accelerator)
    end_process_group_at_exit(Accelerator())  # a second trainer arms nothing more
    print("after train, group initialised:", dist.is_initialized())
    """
)


def test_the_process_group_is_destroyed_at_exit_once_and_not_before():
    done = subprocess.run([sys.executable, "-c", SCRIPT.format(port=free_port())], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "after train, group initialised: True",
        "models and optimizers dropped",
        "at exit, group initialised: False",
    ]


ENGINE_SCRIPT = textwrap.dedent(
    """
    import os
    import torch.distributed as dist
    import trl_zerostd  # what a training script imports first
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="{port}")
    dist.init_process_group("gloo", rank=0, world_size=1)
    from tests.support.fake_vllm import Engine, FakeLLM
    from trl_zerostd.trainer.process_exit import end_process_group_at_exit

    FakeLLM.engine = Engine(tokenizer=None, complete=None, announce_shutdown=True)
    llm = FakeLLM(distributed_executor_backend="external_launcher")  # TRL builds the engine, then our state
    class Accelerator:
        def free_memory(self):
            print("models and optimizers dropped", flush=True)
    accelerator = Accelerator()
    end_process_group_at_exit(accelerator)
    print("trained", flush=True)
    """
)


def test_a_colocated_engine_shuts_down_before_the_group_is_destroyed():
    """Colocated vLLM (the stand-in's external-launcher setup) builds a group over the trainer's and tears it down
    at exit: that runs while the trainer's group is still whole, and ours destroys the group after it."""
    script = ENGINE_SCRIPT.format(port=free_port())
    done = run_from_root([sys.executable, "-c", script], timeout=120)  # python -c: the root first on sys.path
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert done.stdout.splitlines() == ["trained", "engine shut down", "models and optimizers dropped"]


def test_no_handler_without_a_process_group():
    script = (
        "from trl_zerostd.trainer import process_exit; "
        "process_exit.end_process_group_at_exit(object()); print(process_exit._armed)"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.stdout.strip() == "None", done.stderr

"""``trl_zerostd/_exit.py``: a process that made a trainer under a process group ends the group at exit by itself,
and only at exit. (That this removes the abort at exit of two-process runs is measured by
``tests/stress_launches.py --kinds user-...``, not here: the abort is rare and timing-dependent.)"""

import subprocess
import sys
import textwrap

from test_distributed import free_port

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

    from trl_zerostd._exit import end_process_group_at_exit
    accelerator = Accelerator()
    end_process_group_at_exit(accelerator)
    end_process_group_at_exit(accelerator)  # a second trainer registers nothing more
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


def test_no_handler_without_a_process_group():
    script = "from trl_zerostd import _exit; _exit.end_process_group_at_exit(object()); print(_exit._registered)"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.stdout.strip() == "False", done.stderr

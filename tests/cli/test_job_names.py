"""The name `tessera submit` gives a job that names none: the script it runs, else its program."""

import pytest

from cli.submit import default_job_name


@pytest.mark.parametrize(
    ("command", "name"),
    [
        ("python train.py --lr 1", "train.py"),
        ("python3 -u scripts/train.py", "train.py"),
        ("python -m pkg.train --epochs 3", "pkg.train"),
        ("python train.py && echo done", "train.py"),  # a shell line
        ("FOO=1 python3.11 eval.py", "eval.py"),
        ("torchrun --nproc-per-node 8 train.py", "train.py"),
        ("uv run python train.py", "train.py"),
        ("bash ./run.sh", "run.sh"),
        ("./run.sh", "run.sh"),
        ("jupyter lab", "jupyter"),
        ("nvidia-smi", "nvidia-smi"),
        ("python -c 'print(1)'", "python"),
    ],
)
def test_the_default_name_is_the_script_not_the_interpreter(command, name):
    assert default_job_name(command) == name

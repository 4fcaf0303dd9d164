"""The openb loaders read good rows and name the file, row and column of a bad one."""

from __future__ import annotations

from pathlib import Path

import pytest

from scheduling.sim.openb import TraceError, load_nodes, load_pods

POD_HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time"


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_it_reads_nodes_in_file_order(tmp_path):
    path = write(
        tmp_path,
        "nodes.csv",
        "sn,cpu_milli,memory_mib,gpu,model\nn1,96000,786432,8,G2\nn0,64000,262144,2,P100\n",
    )
    nodes = load_nodes(path)
    assert [(n.name, n.cpu_milli, n.memory_mib, n.gpus, n.model) for n in nodes] == [
        ("n1", 96000, 786432, 8, "G2"),
        ("n0", 64000, 262144, 2, "P100"),
    ]


def test_it_reads_full_pod_rows_with_models_and_times(tmp_path):
    path = write(
        tmp_path,
        "pods.csv",
        POD_HEADER + "\np0,6000,12288,1,460,T4|P100,LS,Running,10,20,11\np1,8000,30517,0,0,,BE,Running,5,,\n",
    )
    slice_pod, cpu_pod = load_pods(path)
    assert (slice_pod.num_gpu, slice_pod.gpu_milli, slice_pod.gpu_spec) == (1, 460, ("P100", "T4"))
    assert (slice_pod.creation_time_s, slice_pod.deletion_time_s, slice_pod.scheduled_time_s) == (10, 20, 11)
    assert slice_pod.gpu_milli_total == 460
    assert cpu_pod.gpu_milli_total == 0 and cpu_pod.deletion_time_s is None and cpu_pod.qos == "BE"


def test_it_reads_the_five_column_pod_lists(tmp_path):
    path = write(
        tmp_path, "pods.csv", "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,88000,300000,8,1000\n"
    )
    (pod,) = load_pods(path)
    assert pod.gpu_milli_total == 8000 and pod.gpu_spec == () and pod.creation_time_s is None


@pytest.mark.parametrize(
    "row, message",
    [
        ("p0,abc,12288,1,460,,LS,Running,0,1,0", "row 2: column 'cpu_milli' is not a number"),
        ("p0,6000,,1,460,,LS,Running,0,1,0", "row 2: column 'memory_mib' is empty"),
        ("p0,6000,12288,-1,460,,LS,Running,0,1,0", "row 2: column 'num_gpu' must be >= 0"),
        ("p0,6000,12288,1,1200,,LS,Running,0,1,0", "row 2: column 'gpu_milli' must be <= 1000"),
        (
            "p0,6000,12288,2,500,,LS,Running,0,1,0",
            "row 2: column 'gpu_milli' must be 1000 for a pod of 2 GPUs",
        ),
        ("p0,6000,12288,1,0,,LS,Running,0,1,0", "row 2: column 'gpu_milli' is 0 for a pod asking 1 GPU"),
        ("p0,6000,12288,1,460,,LS,Running,x,1,0", "row 2: column 'creation_time' is not a number"),
        ("p0,6000,12288", "row 2: column 'num_gpu' is missing"),
        ("p0,6000,12288,1,460,,LS,Running,0,1,0,extra", "row 2: more fields than the header"),
    ],
)
def test_it_names_file_row_and_column_of_a_malformed_pod_row(tmp_path, row, message):
    path = write(tmp_path, "pods.csv", POD_HEADER + "\n" + row + "\n")
    with pytest.raises(TraceError) as error:
        load_pods(path)
    assert str(path) in str(error.value)
    assert message in str(error.value)


def test_it_counts_rows_as_a_spreadsheet_does(tmp_path):
    path = write(
        tmp_path, "pods.csv", POD_HEADER + "\np0,1,1,0,0,,,,,,\np1,1,1,0,0,,,,,,\np2,1.5,1,0,0,,,,,,\n"
    )
    with pytest.raises(TraceError, match="row 4: column 'cpu_milli' is not an integer"):
        load_pods(path)


@pytest.mark.parametrize(
    "text, message",
    [
        ("sn,cpu_milli,memory_mib,gpu\nn0,1,1,1\n", "header lacks column(s) model"),
        (
            "sn,cpu_milli,memory_mib,gpu,model\nn0,1,1,2,\n",
            "row 2: column 'model' is empty for a node with 2 GPUs",
        ),
        (
            "sn,cpu_milli,memory_mib,gpu,model\nn0,1,1,1,T4\nn0,1,1,1,T4\n",
            "row 3: column 'sn' repeats node 'n0'",
        ),
        ("sn,cpu_milli,memory_mib,gpu,model\n", "no nodes"),
    ],
)
def test_it_rejects_malformed_node_lists(tmp_path, text, message):
    path = write(tmp_path, "nodes.csv", text)
    with pytest.raises(TraceError) as error:
        load_nodes(path)
    assert message in str(error.value) and str(path) in str(error.value)


def test_it_says_when_the_file_is_missing(tmp_path):
    with pytest.raises(TraceError, match="no such file"):
        load_pods(tmp_path / "absent.csv")

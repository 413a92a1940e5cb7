"""Bad arguments raise ValueError / TypeError carrying the library's Status message; nothing crashes."""
import numpy as np
import pytest
from conftest import HEAD_DIM, make_case, plan_for

import m3sa


@pytest.fixture
def index_topk_call():
    """A valid index_topk call as keyword arguments, to break one at a time."""
    case = make_case(seed=3)
    plan = plan_for(case, "index_topk", "cpu")
    topk = np.zeros((case.config.num_index_heads, case.num_tokens, case.config.top_k), np.int32)
    call = dict(plan=plan, index_q=case.index_q, index_k_cache=case.index_k_cache, batch=case.batch,
                topk=topk, workspace=m3sa.allocate_workspace(plan))
    m3sa.index_topk(**call)  # valid as given
    return call


def test_dtype_with_no_m3sa_equivalent_is_a_type_error(index_topk_call):
    with pytest.raises(TypeError, match="index_q: dtype .* no m3sa equivalent"):
        m3sa.index_topk(**{**index_topk_call, "index_q": index_topk_call["index_q"].view(np.float16)})


def test_wrong_m3sa_dtype_is_a_value_error(index_topk_call):
    as_f32 = index_topk_call["index_q"].astype(np.float32)
    with pytest.raises(ValueError, match="index_q"):
        m3sa.index_topk(**{**index_topk_call, "index_q": as_f32})
    with pytest.raises(ValueError, match="topk"):
        m3sa.index_topk(**{**index_topk_call, "topk": index_topk_call["topk"].astype(np.int64)})


def test_wrong_shape_is_a_value_error(index_topk_call):
    with pytest.raises(ValueError, match="topk"):
        m3sa.index_topk(**{**index_topk_call, "topk": index_topk_call["topk"][:, :, :2].copy()})
    with pytest.raises(ValueError, match="at most 4 dimensions"):
        m3sa.index_topk(**{**index_topk_call, "index_q": index_topk_call["index_q"][None, None]})


def test_unsupported_strides_are_value_errors(index_topk_call):
    index_q = index_topk_call["index_q"]
    every_other = np.repeat(index_q, 2, axis=-1)[..., ::2]
    with pytest.raises(ValueError, match=r"index_q: .*stride 1 in the last dim.*strides \[512, 256, 2\]"):
        m3sa.index_topk(**{**index_topk_call, "index_q": every_other})
    with pytest.raises(ValueError, match="index_q: .*non-negative strides"):
        m3sa.index_topk(**{**index_topk_call, "index_q": index_q[:, ::-1]})


def test_workspace_errors(index_topk_call):
    workspace = index_topk_call["workspace"]
    with pytest.raises(ValueError, match="workspace.bytes"):
        m3sa.index_topk(**{**index_topk_call, "workspace": workspace[:64]})
    with pytest.raises(ValueError, match="workspace.bytes"):
        m3sa.index_topk(**{**index_topk_call, "workspace": None})
    shifted = np.zeros(workspace.nbytes + 64, np.uint8)
    shifted = shifted[(1 - shifted.ctypes.data) % 64:][:workspace.nbytes]  # 1 past a 64-byte line
    with pytest.raises(ValueError, match="workspace.data: expected 64-byte alignment"):
        m3sa.index_topk(**{**index_topk_call, "workspace": shifted})
    with pytest.raises(ValueError, match="contiguous"):
        m3sa.index_topk(**{**index_topk_call, "workspace": workspace[::2]})


def test_read_only_output_is_a_type_error(index_topk_call):
    topk = index_topk_call["topk"].copy()
    topk.flags.writeable = False
    with pytest.raises(TypeError):
        m3sa.index_topk(**{**index_topk_call, "topk": topk})


def test_bad_plan_requests():
    case = make_case()
    with pytest.raises(ValueError, match="backend: expected one of"):
        m3sa.make_plan("index_topk", "tpu", case.config, case.capacities)
    with pytest.raises(ValueError, match="config.top_k"):
        m3sa.make_plan("index_topk", "cpu", m3sa.Config(top_k=99), case.capacities)
    with pytest.raises(m3sa.UnsupportedError, match="no_such"):
        m3sa.make_plan("index_topk", "cpu", case.config, case.capacities, implementation="no_such")
    if not m3sa.cuda_backend_built():
        with pytest.raises(m3sa.UnsupportedError, match="backend cuda"):
            m3sa.make_plan("index_topk", "cuda", case.config, case.capacities)


def test_plan_for_another_op_is_rejected(index_topk_call):
    plan = plan_for(make_case(), "score_blocks", "cpu")
    with pytest.raises(ValueError, match="score_blocks"):
        m3sa.index_topk(**{**index_topk_call, "plan": plan})

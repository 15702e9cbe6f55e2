"""The nf4 operators under torch.compile and CUDA graphs (CTest nf4_torch_compile): a two-layer QLoRA
function calling nf4_linear and nf4_dequantize compiles with fullgraph=True and 0 graph breaks, is
compiled once for batch sizes 3, 5 and 17 (the batch dimension marked dynamic: the Meta kernels propagate
it as a SymInt), and gives eager's forward values and gradients bit for bit. On CUDA (skipped with a
message on a machine without a GPU): the same, and a captured forward+backward replays with new inputs."""
import unittest

import torch
import torch._dynamo
import torch._dynamo.testing

from nf4_torch_ref import Weight, cuda_or_skip_reason, load_plugin

ops = load_plugin()
CUDA_SKIP = cuda_or_skip_reason()
K, H, N, R = 128, 96, 64, 8  # x [B, S, K] -> h [B, S, H] -> y [B, S, N]; LoRA rank R


class Model:
    """Two nf4 linears with LoRA adapters (trained) and a frozen bias on the second, as in QLoRA."""

    def __init__(self, device, dtype, seed=0):
        g = torch.Generator().manual_seed(seed)
        rand = lambda *s: (torch.randn(*s, generator=g) * 0.2).to(dtype).to(device)
        self.w1 = Weight.random([H, K], 64, double_quant=True, seed=seed, device=device)
        self.w2 = Weight.random([N, H], 32, double_quant=False, seed=seed + 1, device=device)
        self.bias2 = rand(N)
        self.lora = [rand(R, K).requires_grad_(), rand(H, R).requires_grad_(), rand(R, H).requires_grad_(),
                     rand(N, R).requires_grad_()]

    def __call__(self, x, a1, b1, a2, b2):
        h = ops.nf4_linear(x, **self.w1.kwargs(), lora_a=a1, lora_b=b1, scaling=0.5)
        y = ops.nf4_linear(h, **self.w2.kwargs(), bias=self.bias2, lora_a=a2, lora_b=b2, scaling=2.0)
        return y, ops.nf4_dequantize(dtype=x.dtype, **self.w1.kwargs())


def run(fn, model, x, gy):
    """Forward and backward; returns (y, deq, dx, da1, db1, da2, db2)."""
    x = x.detach().clone().requires_grad_()
    torch._dynamo.mark_dynamic(x, 0)  # the batch: one graph for every size (eager ignores the mark)
    params = [p.detach().clone().requires_grad_() for p in model.lora]
    y, deq = fn(x, *params)
    grads = torch.autograd.grad(y, [x] + params, gy)
    return (y, deq) + tuple(grads)


class Compile(unittest.TestCase):
    def setUp(self):
        torch._dynamo.reset()

    def check(self, device, dtype):
        model = Model(device, dtype)
        g = torch.Generator().manual_seed(5)
        rand = lambda *s: torch.randn(*s, generator=g).to(dtype).to(device)

        explanation = torch._dynamo.explain(model.__call__)(rand(3, 7, K), *model.lora)
        self.assertEqual(explanation.graph_break_count, 0, explanation.break_reasons)
        self.assertEqual(explanation.graph_count, 1)
        torch._dynamo.reset()

        counter = torch._dynamo.testing.CompileCounterWithBackend("inductor")
        compiled = torch.compile(model.__call__, backend=counter, fullgraph=True)
        names = ("y", "dequantized", "dx", "d lora_a1", "d lora_b1", "d lora_a2", "d lora_b2")
        with torch._dynamo.config.patch(error_on_recompile=True):
            for batch in (3, 5, 17):
                x, gy = rand(batch, 7, K), rand(batch, 7, N)
                eager = run(model.__call__, model, x, gy)
                got = run(compiled, model, x, gy)
                for name, e, c in zip(names, eager, got):
                    self.assertEqual(c.shape, e.shape, name)
                    self.assertTrue(torch.equal(c, e), f"batch {batch}: compiled {name} differs from eager")
        self.assertEqual(counter.frame_count, 1, "compiled more than once across batch sizes")

    def test_cpu(self):
        self.check("cpu", torch.float32)

    @unittest.skipIf(CUDA_SKIP, CUDA_SKIP)
    def test_cuda(self):
        self.check("cuda", torch.bfloat16)


class CudaGraph(unittest.TestCase):
    @unittest.skipIf(CUDA_SKIP, CUDA_SKIP)
    def test_capture_forward_backward(self):
        """Whole forward+backward capture (torch.cuda.graphs): new x, grad_y, LoRA values and even a new
        packed weight copied into the static tensors, then a replay equals an eager call bit for bit."""
        dev, dtype = "cuda", torch.bfloat16
        model = Model(dev, dtype)
        g = torch.Generator().manual_seed(7)
        rand = lambda *s: torch.randn(*s, generator=g).to(dtype).to(dev)
        static_x, static_gy = rand(4, 9, K).requires_grad_(), rand(4, 9, N)
        params = model.lora

        def step():
            y, deq = model(static_x, *params)
            y.backward(static_gy)
            return y, deq

        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up off the capture stream, as torch.cuda.graphs requires
            for _ in range(3):
                for t in [static_x] + params:
                    t.grad = None
                step()
        torch.cuda.current_stream().wait_stream(side)
        for t in [static_x] + params:
            t.grad = None
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_y, static_deq = step()

        for trial in range(3):
            other = Model(dev, dtype, seed=10 + trial)  # new values for every input, weights included
            x, gy = rand(4, 9, K), rand(4, 9, N)
            with torch.no_grad():
                static_x.copy_(x)
                static_gy.copy_(gy)
                for dst, src in zip(params, other.lora):
                    dst.copy_(src)
                for mine, theirs in ((model.w1, other.w1), (model.w2, other.w2)):
                    for f in ("codes", "absmax", "nested_absmax", "nested_code"):
                        if getattr(mine, f) is not None:
                            getattr(mine, f).copy_(getattr(theirs, f))
            graph.replay()
            # The reference is `model` itself, now holding the copied tensors (its offset, a Python float
            # baked into the capture like any scalar argument, is unchanged).
            want = run(model.__call__, model, x, gy)
            got = (static_y, static_deq, static_x.grad) + tuple(p.grad for p in params)
            for name, w, c in zip(("y", "dequantized", "dx", "da1", "db1", "da2", "db2"), want, got):
                self.assertTrue(torch.equal(c, w), f"replay {trial}: {name} differs from eager")


if __name__ == "__main__":
    unittest.main(verbosity=2)

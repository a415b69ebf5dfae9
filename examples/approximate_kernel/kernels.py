"""The kernels to check: {API name as msprobe writes it: "module:function"}.

pytest imports this file when it starts (in every xdist worker too), to know which items to keep,
so it stays torch-free; the kernel modules named on the right are imported when the first item of
their API runs. Use it with:

    pytest examples/approximate_kernel/ --msprobe-kernels examples/approximate_kernel/kernels.py:KERNELS
"""

KERNELS = {
    "Functional.softmax": "naive_softmax:softmax",
}

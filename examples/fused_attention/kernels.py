"""The kernels to check, {API name as msprobe writes it: "module:function"} (torch-free: pytest imports
this file at start-up in every process). Use them with:

    pytest examples/fused_attention/ --msprobe-kernels examples/fused_attention/kernels.py:SOUND
    pytest examples/fused_attention/ --msprobe-kernels examples/fused_attention/kernels.py:BUGGY
"""

SOUND = {"NPU.npu_fusion_attention": "flash:flash_attention"}
BUGGY = {"NPU.npu_fusion_attention": "flash:flash_attention_bf16_rowsum"}

"""The quantized KV store: the quantize/dequantize rule, packed codes, and the store that holds kept tokens packed."""

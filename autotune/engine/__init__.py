# Raised when a change to the engine changes what a forward costs, so that timings cached by
# an earlier engine are measured again rather than reused (2: the engine's own small-batch
# float32 kernel, fused RMSNorm, grouped-query attention without copies; 3: the decoder
# layers in C++, weights in huge pages; 4: the fused RMSNorm in half precision on GPUs;
# 5: the rotation in three operations off the CPU).
REVISION = 5

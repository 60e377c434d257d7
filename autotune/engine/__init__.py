# Raised when a change to the engine changes what a forward costs, so that timings cached by
# an earlier engine are measured again rather than reused (2: the engine's own small-batch
# float32 kernel, fused RMSNorm, grouped-query attention without copies; 3: the decoder
# layers in C++, weights in huge pages; 4: the fused RMSNorm in half precision on GPUs;
# 5: off the CPU, the rotation in three operations and the residual sums in the products;
# 6: off the CPU, the rotation one product with each position's matrix, the final norm fused).
REVISION = 6

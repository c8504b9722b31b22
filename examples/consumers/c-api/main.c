/* Uses the installed C API: a matmul checked by hand, errors reported as a status + message (an op's, a model
 * folder's), the sampling defaults. */
#include <microllm/capi/microllm.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

int main(void) {
  const float a_data[6] = {1, 2, 3, 4, 5, 6};    /* [2, 3] */
  const float b_data[6] = {1, 0, 0, 1, 1, 1};    /* [3, 2] */
  const int64_t a_shape[2] = {2, 3}, b_shape[2] = {3, 2};
  microllm_tensor *a = NULL, *b = NULL, *c = NULL, *bad = NULL;
  if (microllm_tensor_from_data(a_data, MICROLLM_F32, a_shape, 2, &a) != MICROLLM_OK ||
      microllm_tensor_from_data(b_data, MICROLLM_F32, b_shape, 2, &b) != MICROLLM_OK ||
      microllm_matmul(a, b, 0, 0, &c) != MICROLLM_OK) {
    fprintf(stderr, "unexpected failure: %s\n", microllm_last_error());
    return 1;
  }
  float out[4];
  microllm_tensor_to_f32(c, out, 4);
  const float expected[4] = {4, 5, 10, 11};
  for (int i = 0; i < 4; ++i) {
    if (fabsf(out[i] - expected[i]) > 1e-6f) {
      fprintf(stderr, "c[%d] = %f, expected %f\n", i, out[i], expected[i]);
      return 1;
    }
  }
  /* [2, 3] x [2, 3] has mismatched inner dims: a shape error that names the op. */
  const microllm_status status = microllm_matmul(a, a, 0, 0, &bad);
  if (status != MICROLLM_ERROR_SHAPE || strstr(microllm_last_error(), "[matmul]") == NULL) {
    fprintf(stderr, "expected a matmul shape error, got status %d: %s\n", (int)status, microllm_last_error());
    return 1;
  }
  /* A folder that is not there: an I/O error naming it. */
  microllm_model* model = NULL;
  if (microllm_model_load("/nonexistent/model", "cpu", "f32", &model) != MICROLLM_ERROR_IO ||
      strstr(microllm_last_error(), "/nonexistent/model") == NULL || model != NULL) {
    fprintf(stderr, "expected an I/O error naming the folder: %s\n", microllm_last_error());
    return 1;
  }
  const microllm_sampling sampling = microllm_sampling_default();
  if (sampling.temperature != 0 || sampling.max_tokens <= 0 || microllm_cuda_device_count() < 0) {
    fprintf(stderr, "unexpected sampling defaults or device count\n");
    return 1;
  }
  printf("microLLM %s C API ok; error path: %s\n", microllm_version(), microllm_last_error());
  microllm_tensor_free(a);
  microllm_tensor_free(b);
  microllm_tensor_free(c);
  return 0;
}

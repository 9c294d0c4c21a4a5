"""Keras model.fit under MultiWorkerMirroredStrategy, timed with netbench.track's callback:

    netbench sweep --latency 1,20ms --workers 2 -- python examples/keras_fit.py

MultiWorkerMirroredStrategy reads TF_CONFIG, which netbench gives every rank. model.fit under
it needs Keras 2 (tf_keras; Keras 3 fails there, keras-team/keras#20585). The callback stops
fit when netbench asks; without netbench it trains --epochs epochs.
"""

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf_keras as keras  # noqa: E402

from netbench import track  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2, help="epochs when not under netbench")
    parser.add_argument("--batch-size", type=int, default=64, help="per worker")
    args = parser.parse_args()
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    workers = strategy.num_replicas_in_sync
    with strategy.scope():
        model = keras.Sequential([keras.layers.Flatten(input_shape=(28, 28)), keras.layers.Dense(512, activation="relu"),
                                  keras.layers.Dense(512, activation="relu"), keras.layers.Dense(10)])
        model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.batch_size * workers * 50, 28, 28), dtype=np.float32)
    y = rng.integers(0, 10, len(x))
    data = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(args.batch_size * workers)
    epochs = 1000000 if track.active() else args.epochs  # under netbench: until it asks to stop
    model.fit(data, epochs=epochs, steps_per_epoch=50, verbose=0,
              callbacks=[track.keras_callback(images_per_batch=args.batch_size)])


if __name__ == "__main__":
    main()

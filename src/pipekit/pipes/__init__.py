"""pipekit's DataPipes.

Importing :mod:`pipekit` (or this package) registers every functional name,
so pipes chain: ``IterableWrapper(urls).open_files_by_fsspec().decode_image()``.
Every pipe is also exported under torchdata 0.9's class name, so
``from torchdata.datapipes.iter import X`` becomes ``from pipekit.pipes import X``;
the map-style pipes of ``torchdata.datapipes.map`` whose names clash with
iterable ones are exported with a ``Map`` prefix (``MapBatcher``,
``MapInMemoryCacheHolder``, ``MapUnZipper``...).  The torchdata 0.9 pipes
pipekit does not have, and why, are listed in the migration guide
(``docs/migration/torchdata.md``, "Not in pipekit, deliberately").

Where each pipe lives (functional name -> module):

==========================================================  ============================
``map filter shuffle batch unbatch collate zip concat mux``  :mod:`~pipekit.pipes._builtin`
``fork demux groupby sharding_filter`` (torch's own)         :mod:`~pipekit.pipes._builtin`
``list_files_by_fsspec open_files_by_fsspec``               :mod:`~pipekit.pipes._fsspec_io`
``save_by_fsspec save_to_disk``                              :mod:`~pipekit.pipes._fsspec_save`
``list_files`` (torch's, resumable)                          :mod:`~pipekit.pipes._file_lister`
``load_from_tar load_from_zip``                              :mod:`~pipekit.pipes._archives`
``decompress load_from_bz2 load_from_xz extract``            :mod:`~pipekit.pipes._decompress`
``webdataset shard_expand``                                  :mod:`~pipekit.pipes._webdataset`
``load_tar_samples`` (tar members grouped, as bytes)         :mod:`~pipekit.pipes._tar_samples`
``write_shards`` ``ShardWriter TarWriter``                   :mod:`~pipekit.pipes._shard_writer`
``readlines parse_csv parse_csv_as_dict parse_json_files``   :mod:`~pipekit.pipes._parsing`
``decode_image decode``                                      :mod:`~pipekit.pipes._decode`
``flatmap shuffled_flatmap map_batches threadpool_map``      :mod:`~pipekit.pipes._mapping`
``async_map_batches``                                        :mod:`~pipekit.pipes._mapping`
``header cycle repeat enumerate add_index set_length``       :mod:`~pipekit.pipes._flow`
``zip_longest zip_with_iter zip_with_map``                   :mod:`~pipekit.pipes._zipping`
``mux_longest`` ``SampleMultiplexer``                        :mod:`~pipekit.pipes._multiplexing`
``random_split round_robin_demux unzip``                     :mod:`~pipekit.pipes._splitting`
``to_map_datapipe`` (iter) ``to_iter_datapipe`` (map)        :mod:`~pipekit.pipes._conversion`
``bucketbatch max_token_bucketize in_batch_shuffle``         :mod:`~pipekit.pipes._bucketing`
``pad_collate``                                              :mod:`~pipekit.pipes._collate`
``in_memory_cache``                                          :mod:`~pipekit.pipes._memory_cache`
``in_memory_cache unzip`` (on map-style pipes)               :mod:`~pipekit.pipes._mapstyle`
``on_disk_cache end_caching``                                :mod:`~pipekit.pipes._disk_cache`
``prefetch pin_memory``                                      :mod:`~pipekit.pipes._prefetch`
``read_from_http``                                           :mod:`~pipekit.pipes._http`
``check_hash``                                               :mod:`~pipekit.pipes._hashing`
``drop slice flatten rows2columnar lines_to_paragraphs``     :mod:`~pipekit.pipes._columns`
``fullsync``                                                 :mod:`~pipekit.pipes._distributed`
``append_index normalize augment augment_batch``             :mod:`~pipekit.pipes._sample_transforms`
``read_geo`` (bounding boxes -> geo samples)                 :mod:`pipekit.geo._pipes`
==========================================================  ============================

``pipekit.pipes.base.owner_of("decode_image")`` answers the same question at run time.
"""

from pipekit.pipes._archives import *
from pipekit.pipes.base import IterDataPipe, MapDataPipe, Resumable, functional_datapipe
from pipekit.pipes._bucketing import *
from pipekit.pipes._builtin import *
from pipekit.pipes._collate import *
from pipekit.pipes._columns import *
from pipekit.pipes._conversion import *
from pipekit.pipes._decompress import *
from pipekit.pipes._decode import *
from pipekit.pipes._disk_cache import *
from pipekit.pipes._distributed import *
from pipekit.pipes._flow import *
from pipekit.pipes._fsspec_io import *
from pipekit.pipes._hashing import *
from pipekit.pipes._http import *
from pipekit.pipes._memory_cache import *
from pipekit.pipes._multiplexing import *
from pipekit.pipes._parsing import *
from pipekit.pipes._prefetch import *
from pipekit.pipes._splitting import *
from pipekit.pipes._mapping import *
from pipekit.pipes._mapstyle import *
from pipekit.pipes._sample_transforms import *
from pipekit.pipes._shard_writer import *
from pipekit.pipes._tar_samples import *
from pipekit.pipes._webdataset import *
from pipekit.pipes._zipping import *
from pipekit.pipes import (
    _archives as archives,
    _bucketing as bucketing,
    _builtin as builtin,
    _collate as collate,
    _columns as columns,
    _conversion as conversion,
    _decompress as decompress,
    _decode as decode,
    _disk_cache as disk_cache,
    _distributed as distributed,
    _flow as flow,
    _fsspec_io as fsspec_io,
    _hashing as hashing,
    _http as http,
    _memory_cache as memory_cache,
    _multiplexing as multiplexing,
    _parsing as parsing,
    _prefetch as prefetch,
    _splitting as splitting,
    _mapping as mapping,
    _mapstyle as mapstyle,
    _sample_transforms as sample_transforms,
    _shard_writer as shard_writer,
    _tar_samples as tar_samples,
    _webdataset as webdataset,
    _zipping as zipping,
)

__all__ = sorted(
    {
        "IterDataPipe",
        "MapDataPipe",
        "Resumable",
        "functional_datapipe",
        *archives.__all__,
        *bucketing.__all__,
        *builtin.__all__,
        *collate.__all__,
        *columns.__all__,
        *conversion.__all__,
        *decompress.__all__,
        *decode.__all__,
        *disk_cache.__all__,
        *distributed.__all__,
        *flow.__all__,
        *fsspec_io.__all__,
        *hashing.__all__,
        *http.__all__,
        *memory_cache.__all__,
        *multiplexing.__all__,
        *parsing.__all__,
        *prefetch.__all__,
        *splitting.__all__,
        *mapping.__all__,
        *mapstyle.__all__,
        *sample_transforms.__all__,
        *shard_writer.__all__,
        *tar_samples.__all__,
        *webdataset.__all__,
        *zipping.__all__,
    }
)


# Imported with the package: it also makes the functional names torchdata had and pipekit lacks
# (``.list_files_by_s3()``) raise an AttributeError naming the pipekit way, on every pipe.
from pipekit.pipes import _missing


def __getattr__(name: str) -> object:
    """A torchdata name pipekit deliberately lacks raises ``AttributeError`` naming what to use instead.

    ``from pipekit.pipes import S3FileLister`` raises the ``ImportError`` that statement raises, naming it too.
    """
    import sys

    raise _missing.missing_name("torchdata", __name__, name, sys._getframe(1))
